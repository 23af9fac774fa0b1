"""The LoRA adapters an embedded engine serves, with SGLang's names and semantics.

SGLang (managers/io_struct.py, lora/lora_registry.py, entrypoints/http_server.py) serves adapters when
launched with `--enable-lora` (`--max-lora-rank`, `--lora-target-modules`, `--max-loaded-loras`):

    POST /load_lora_adapter {"lora_name", "lora_path", "pinned"}           a PEFT directory
    POST /load_lora_adapter_from_tensors {"lora_name", "config_dict", "serialized_tensors", "load_format"}
    POST /unload_lora_adapter {"lora_name"}
    → LoRAUpdateOutput {"success", "error_message", "loaded_adapters": {name: path}} (400 when not success)
    POST /generate {..., "lora_path": name}                                 the adapter a request runs on

A name is registered once (loading it again is an error until it is unloaded); each load gets a fresh
`lora_id`, which keys the prefix cache, so KV computed under one adapter (or under an earlier load of
the same name) is never served to another. An unload stops new requests naming the adapter at once
and frees it when the requests already running on it have finished. The embedded engine accepts the
same bodies (`load_format: "safetensors"` for tensors: base64 of a safetensors file, as for
`/update_weights_from_tensor`; it unpickles nothing it receives).

    adapters = EngineAdapters(arch, section)
    adapters.load("policy-v3", read_adapter_dir(path, arch), str(path))
    lora_id = adapters.acquire("policy-v3")      # a request starts on it (RequestRefused if unknown)
    adapters.release(lora_id)                    # ... and finishes
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import torch

from gyre.config.engine import EngineSection
from gyre.model.arch import ModelArch
from gyre.model.lora import LoraAdapter, LoraBank
from gyre.model.lora_spec import ALL_LINEAR, TARGETS
from services.cell_agent.engine.protocol import RequestRefused

NOT_ENABLED = (
    "LoRA is not enabled. Please set `--enable-lora` to enable LoRA "
    "(cell_agent.engine.enable_lora on the embedded engine)."
)


@dataclass(slots=True)
class LoadedAdapter:
    name: str
    path: str
    lora_id: str
    adapter: LoraAdapter
    pinned: bool
    in_flight: int = 0
    registered: bool = True
    """False once an unload began: no new request may name it."""


class EngineAdapters:
    """Registry (name → the adapter a new request gets) and bank (lora_id → stacked matrices) in one."""

    def __init__(self, arch: ModelArch, section: EngineSection, dtype: torch.dtype = torch.float32) -> None:
        self.enabled = section.enable_lora
        self.max_rank = section.max_lora_rank
        self.max_loaded = section.max_loaded_loras
        targets = set(section.lora_target_modules)
        self.target_modules = set(TARGETS) if not targets or ALL_LINEAR in targets else targets
        self.bank = LoraBank(arch, dtype)
        self._by_name: dict[str, LoadedAdapter] = {}
        self._by_id: dict[str, LoadedAdapter] = {}

    # ---- loading and unloading (scheduling loop, between steps) ----------------------------------

    def load(self, name: str, adapter: LoraAdapter, path: str, pinned: bool = False) -> None:
        """Serve `adapter` as `name` (RequestRefused: not enabled, the name is taken, too many, its rank
        or targets exceed the server's)."""
        if not self.enabled:
            raise RequestRefused(NOT_ENABLED)
        if not name:
            raise RequestRefused("lora_name is required")
        if name in self._by_name:
            raise RequestRefused(f"LoRA with name {name} already exists. Loaded LoRAs: {list(self._by_name)}")
        if len(self._by_id) >= self.max_loaded:
            raise RequestRefused(
                f"Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded LoRA adapters is "
                f"{self.max_loaded}. Please unload some LoRA adapters before loading new ones."
            )
        if self.max_rank is not None and adapter.spec.rank > self.max_rank:
            raise RequestRefused(
                f"LoRA adapter {name} has rank {adapter.spec.rank}, above --max-lora-rank {self.max_rank}"
            )
        extra = {t.module for t in adapter.targets} - self.target_modules
        if extra:
            raise RequestRefused(
                f"LoRA adapter {name} targets {sorted(extra)}, outside --lora-target-modules "
                f"{sorted(self.target_modules)}"
            )
        loaded = LoadedAdapter(name, path, uuid.uuid4().hex, adapter.eval(), pinned)
        self._by_name[name] = loaded
        self._by_id[loaded.lora_id] = loaded
        self.bank.load(loaded.lora_id, adapter)

    def unregister(self, name: str) -> str:
        """First half of an unload: new requests naming `name` are refused from now on; returns its id."""
        if not self.enabled:
            raise RequestRefused(NOT_ENABLED)
        loaded = self._by_name.pop(name, None)
        if loaded is None:
            raise RequestRefused(f"LoRA with name {name} does not exist. Loaded LoRAs: {list(self._by_name)}")
        loaded.registered = False
        return loaded.lora_id

    def in_flight(self, lora_id: str) -> int:
        loaded = self._by_id.get(lora_id)
        return 0 if loaded is None else loaded.in_flight

    def drop(self, lora_id: str) -> None:
        """Second half of an unload, once no request runs on it: free its matrices."""
        loaded = self._by_id.pop(lora_id, None)
        if loaded is not None:
            assert loaded.in_flight == 0, (
                f"adapter {loaded.name} dropped with {loaded.in_flight} requests on it"
            )
            self.bank.unload(lora_id)

    # ---- requests ------------------------------------------------------------------------------------

    def acquire(self, name: str) -> str:
        """The id of the adapter a new request named (its count of requests in flight + 1)."""
        if not self.enabled:
            raise RequestRefused(NOT_ENABLED)
        loaded = self._by_name.get(name)
        if loaded is None:
            raise RequestRefused(
                f"The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: {list(self._by_name)}."
            )
        loaded.in_flight += 1
        return loaded.lora_id

    def release(self, lora_id: str) -> None:
        loaded = self._by_id.get(lora_id)
        if loaded is not None and loaded.in_flight > 0:
            loaded.in_flight -= 1

    def adapter(self, lora_id: str) -> LoraAdapter:
        return self._by_id[lora_id].adapter

    def name_of(self, lora_id: str) -> str:
        return self._by_id[lora_id].name

    def id_of(self, name: str) -> str | None:
        loaded = self._by_name.get(name)
        return None if loaded is None else loaded.lora_id

    def loaded(self) -> dict[str, str]:
        """name → path of every registered adapter (LoRAUpdateOutput's `loaded_adapters`)."""
        return {name: a.path for name, a in self._by_name.items()}

    def stats(self) -> dict[str, int]:
        return {
            "lora_adapters_loaded": len(self._by_id),
            "lora_requests_in_flight": sum(a.in_flight for a in self._by_id.values()),
        }
