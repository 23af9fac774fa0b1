"""The policy as LoRA adapters on a rollout engine: how a publication is named, loaded and retired.

A run that trains a LoRA adapter publishes each policy version v as a PEFT directory and serves it
under the name `policy-v<v>` (`adapter_name`), through SGLang's own endpoints, on SGLang and on the
embedded engine alike:

    await serve_adapter(client, 4, path="/ckpt/published/v00000004")   # or tensors= + config= (embedded)

loads `policy-v4`, sets the engine's weight version to "4" (`/update_weight_version`), then unloads the
policy adapters older than the one before it (`stale_adapters`): the engine holds the newest and the
previous, so a call that was sent with the previous name just before the publication still finds it.
The proxy names, per engine, the adapter of the weight version that engine reports (`adapter_name`;
version 0 is the base model: the initial adapter's B is zero), so no call names an adapter its engine
has not loaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gyre.engine.client import EngineClient
from gyre.engine.errors import EngineRequestError

if TYPE_CHECKING:
    import torch

PREFIX = "policy-v"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def adapter_name(version: int | str | None) -> str | None:
    """The adapter serving policy `version` (a weight version string is accepted); None for the base
    model (version 0, or a version that is not a number)."""
    text = str(version) if version is not None else ""
    if not text.isdigit() or int(text) == 0:
        return None
    return f"{PREFIX}{int(text)}"


def adapter_version(name: str) -> int | None:
    """The policy version of an adapter Gyre named, else None."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def stale_adapters(loaded: Iterable[str], version: int) -> list[str]:
    """The policy adapters to unload once `version` is served: all but the newest two up to it."""
    versions = sorted(v for name in loaded if (v := adapter_version(name)) is not None and v <= version)
    keep = set(versions[-2:])
    return [f"{PREFIX}{v}" for v in versions if v not in keep]


async def serve_adapter(
    client: EngineClient,
    version: int,
    *,
    path: str | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Make the engine at `client` serve policy `version`: load its adapter (a directory the engine can
    read, or the matrices and adapter_config.json in the request), report the version, retire the
    adapters older than the previous one. Loading an adapter the engine already holds is not an error."""
    name = adapter_name(version)
    assert name is not None, f"policy version {version} has no adapter (version 0 is the base model)"
    try:
        if tensors is not None and config is not None:
            loaded = await client.load_lora_adapter_from_tensors(name, tensors, config)
        elif path is not None:
            loaded = await client.load_lora_adapter(name, path)
        else:
            raise ValueError("serve_adapter needs a path or tensors and config")
    except EngineRequestError as e:
        if "already exists" not in e.message:
            raise
        loaded = {name: path or ""}
    await client.update_weight_version(str(version))
    for stale in stale_adapters(loaded, version):
        try:
            await client.unload_lora_adapter(stale)
        except EngineRequestError as e:  # already gone (another loader retired it)
            if "does not exist" not in e.message:
                raise
