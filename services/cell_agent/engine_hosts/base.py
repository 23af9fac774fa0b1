"""The rollout engine a cell hosts, behind one interface for the role switches.

The engine process lives as long as the cell agent; a switch to training only stops admission,
aborts what is in flight (the proxy retries it on another engine) and releases memory:

    n = await host.hand_back()                   # requests handed back for reroute
    await host.release(weights=False)            # KV cache (and weights where configured)
    ...
    await host.resume()                          # memory back
    await host.load_weights(path, version=4)     # newest published weights
    await host.reopen()                          # admit again

A run that trains a LoRA adapter publishes PEFT adapter directories: `load_weights` of one loads it as
the policy adapter of its version (`gyre.engine.adapters`: loaded, the weight version set, adapters
older than the previous one unloaded) on top of the base weights, and `push_adapter` does the same
with the adapter in hand.

An engine in its own process can die under the cell; a host that restarts it (`sglang`) asks the cell's
`weights_on_restart` what the new one should serve (the newest publication), restores the state the
role switches left (admission stopped, memory released) and then awaits the cell's `on_restarted`;
`supervision()` is what the cell's service supervises (raises once the engine is dead for good).

To add an engine back end: subclass `EngineHost` (or `HttpEngineHost` for a server that speaks SGLang's
native HTTP API) in a file of this package, set `name`, implement the abstract members, add the class to
`ENGINE_HOSTS` in `__init__.py` and its name to `gyre.engine.backends.ENGINE_BACKENDS` (what the config
field `cell_agent.engine.backend` is checked against); tests/integration/test_engine_backends.py then
runs the engine contract against it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from prometheus_client import CollectorRegistry

from gyre.config.engine import EngineSection
from gyre.model.lora import LoraAdapter


class EngineHost(ABC):
    name: ClassVar[str]

    def __init__(self, section: EngineSection, model_dir: Path, *, log_path: Path | None = None) -> None:
        self.section = section
        self.model_dir = model_dir
        self.log_path = log_path
        """Where an engine that runs as its own process writes its output (None: discarded)."""
        self.weights_released = False
        self.weights_on_restart: Callable[[], Awaitable[tuple[Path, int] | None]] | None = None
        """Set by the cell: the weights a restarted engine serves (published directory, version); None: the model's."""
        self.on_restarted: Callable[[], Awaitable[None]] | None = None
        """Set by the cell: awaited once a restarted engine serves again, its state restored."""

    def supervision(self) -> Coroutine[Any, Any, None] | None:
        """What the cell's service supervises while the engine runs (raises once the engine is dead for
        good); None for an engine that lives and dies with this process."""
        return None

    @property
    @abstractmethod
    def url(self) -> str: ...

    @property
    def metrics_registry(self) -> CollectorRegistry | None:
        """The engine's Prometheus series when they live in this process (None: the engine serves its own)."""
        return None

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def num_in_flight(self) -> int:
        """Requests running or queued, as the engine last reported them."""

    @abstractmethod
    async def hand_back(self) -> int:
        """Stop admitting and abort every request in flight (running or queued); returns how many."""

    @abstractmethod
    async def release(self, *, weights: bool) -> None:
        """Release the KV cache (and the weights if `weights`)."""

    @abstractmethod
    async def resume(self) -> None:
        """Take back the memory released by `release`."""

    @abstractmethod
    async def load_weights(self, path: Path, version: int) -> None:
        """Serve the weights of a published directory as `version`; the prefix cache is flushed. A
        PEFT adapter directory is served as the policy adapter of `version` on the base weights."""

    @abstractmethod
    async def push_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Serve `adapter` as the policy adapter of `version` (a LoRA run's publication)."""

    @abstractmethod
    async def push_weights(
        self, named: Mapping[str, torch.Tensor], version: int, *, abort_requests: bool = False
    ) -> None:
        """Serve these weights as `version`; the prefix cache is flushed; running requests continue
        under the new weights unless `abort_requests`."""

    @abstractmethod
    async def reopen(self) -> None:
        """Admit requests again."""

    @abstractmethod
    async def wait_ready(self, timeout_s: float) -> None: ...

    @abstractmethod
    async def weight_version(self) -> str: ...
