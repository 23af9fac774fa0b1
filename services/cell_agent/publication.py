"""How the core pushes published weights into the rollout engine of another cell, by
`cell_agent.trainer.publication`:

    tensor        POST /update_weights_from_tensor with the tensors (safetensors to the embedded engine;
                  SGLang's serialized form, which only a server on the same host can open)
    disk          POST /update_weights_from_disk naming the published HF directory (`published/v<N>/`,
                  which every engine must see: a shared volume on clusters)
    distributed   POST /init_weights_update_group once per engine: the core hosts a group of itself
                  (rank 0) and the engine's TP ranks (`dist_backend`: gloo on CPU, NCCL between GPUs);
                  then per publication POST /update_weights_from_distributed while the core broadcasts
                  each tensor over that group (`gyre.engine.update_group`)

Every push tags the weights with the policy version (`weight_version`) and keeps today's rule: the
engine flushes its prefix cache, so no prefix computed under older weights is served after it.

A run that trains a LoRA adapter pushes the adapter instead (`push_adapter`, `gyre.engine.adapters`):
`tensor` sends its matrices to an embedded engine (`/load_lora_adapter_from_tensors`, safetensors) and
names the published PEFT directory to SGLang (`/load_lora_adapter`, which reads it from disk), `disk`
names the directory to both; each load gets a fresh `lora_id`, so no prefix is shared across versions.
Requests running on the engine continue under the new weights unless `publish_abort_requests`.
A distributed group that fails (the engine restarted, a peer died) is dropped and the push is retried
once over a fresh group; `close()` destroys the groups on the engines.

    publisher = Publisher(section, bind_host="127.0.0.1", advertise_host="127.0.0.1", timeout_s=120, run_id="r1")
    await publisher.push(url, named, version=4, path=published_dir)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from gyre.config.training import TrainerSection
from gyre.engine import EngineClient, EngineError
from gyre.engine.adapters import serve_adapter
from gyre.engine.update_group import UpdateGroupSender, dtype_name, in_daemon_thread
from gyre.log import get_logger
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import adapter_config

log = get_logger("gyre.cell_agent.publication")


@dataclass(slots=True)
class _Group:
    sender: UpdateGroupSender
    name: str


class Publisher:
    def __init__(
        self, section: TrainerSection, *, bind_host: str, advertise_host: str, timeout_s: float, run_id: str
    ) -> None:
        self.mode = section.publication
        self.abort_requests = section.publish_abort_requests
        self.backend = section.dist_backend
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.timeout_s = timeout_s
        self.run_id = run_id
        self._groups: dict[str, _Group] = {}

    async def push(self, url: str, named: Mapping[str, torch.Tensor], *, version: int, path: Path) -> None:
        """Make the engine at `url` serve `named` (the published directory `path`) as `version`."""
        async with EngineClient(url, timeout_s=self.timeout_s) as client:
            if self.mode == "tensor":
                await client.update_weights_from_tensor(
                    named, weight_version=str(version), abort_all_requests=self.abort_requests
                )
            elif self.mode == "disk":
                await client.update_weights_from_disk(
                    str(path), weight_version=str(version), abort_all_requests=self.abort_requests
                )
            else:
                await self._distributed(client, url, named, version)

    async def push_adapter(
        self, url: str, adapter: LoraAdapter, *, version: int, path: Path, base: Path
    ) -> None:
        """Make the engine at `url` serve `adapter` (the published directory `path`, for the base model
        `base`) as the policy adapter of `version`."""
        async with EngineClient(url, timeout_s=self.timeout_s) as client:
            if self.mode == "tensor" and await client.server_kind() == "embedded":
                config = adapter_config(adapter.spec, adapter.targets, str(base))
                await serve_adapter(client, version, tensors=adapter.tensors(), config=config)
            elif self.mode in ("tensor", "disk"):
                await serve_adapter(client, version, path=str(path))
            else:
                raise ValueError(
                    "a LoRA adapter is published by tensor or disk, not over a weight-update group"
                )

    async def _distributed(
        self, client: EngineClient, url: str, named: Mapping[str, torch.Tensor], version: int
    ) -> None:
        for attempt in (1, 2):
            group = self._groups.get(url)
            fresh = group is None
            if group is None:
                group = await self._open(client)
                self._groups[url] = group
            try:
                await self._broadcast(client, group, named, version)
                return
            except (EngineError, RuntimeError, TimeoutError) as e:
                self._forget(url)
                if fresh or attempt == 2:
                    raise
                log.warning("weight_update_group_reopened", url=url, error=str(e))

    async def _open(self, client: EngineClient) -> _Group:
        """Host a group for the engine's ranks and have them join it."""
        info = await client.get_server_info()
        world_size = 1 + int(info.get("tp_size") or 1)
        sender = await asyncio.to_thread(
            UpdateGroupSender.host,
            bind_host=self.bind_host,
            world_size=world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        name = f"gyre-{self.run_id}-{uuid.uuid4().hex[:8]}"
        joined = in_daemon_thread(lambda: sender.connect(name))
        try:
            await client.init_weights_update_group(
                master_address=self.advertise_host,
                master_port=sender.port,
                rank_offset=1,
                world_size=world_size,
                group_name=name,
                backend=self.backend,
                timeout_s=self.timeout_s,
            )
            await asyncio.wait_for(joined, self.timeout_s)
        except BaseException:
            sender.close()
            raise
        log.info("weight_update_group_opened", url=client.base_url, group=name, world_size=world_size)
        return _Group(sender, name)

    async def _broadcast(
        self, client: EngineClient, group: _Group, named: Mapping[str, torch.Tensor], version: int
    ) -> None:
        names = list(named)
        tensors = [named[n].detach().contiguous() for n in names]
        request = asyncio.ensure_future(
            client.update_weights_from_distributed(
                names,
                [dtype_name(t.dtype) for t in tensors],
                [list(t.shape) for t in tensors],
                group_name=group.name,
                weight_version=str(version),
                flush_cache=True,
                abort_all_requests=self.abort_requests,
                timeout_s=self.timeout_s,
            )
        )
        try:
            works = group.sender.broadcast(tensors)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout_s
            while not all(w.is_completed() for w in works):
                if request.done() and request.exception() is not None:
                    break  # refused or failed: the engine stopped receiving
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"broadcasting {len(tensors)} tensors to {client.base_url} took over {self.timeout_s} s"
                    )
                await asyncio.sleep(0.002)
            await request
            for w in works:
                w.wait()
        finally:
            if not request.done():
                request.cancel()

    def _forget(self, url: str) -> None:
        group = self._groups.pop(url, None)
        if group is not None:
            group.sender.close()

    async def close(self) -> None:
        """Destroy the groups on their engines (best effort: an engine may be gone) and locally."""
        for url, group in list(self._groups.items()):
            try:
                async with EngineClient(url, timeout_s=5.0, max_connect_retries=0) as client:
                    await client.destroy_weights_update_group(group.name)
            except EngineError as e:
                log.info("weight_update_group_not_destroyed", url=url, group=group.name, error=str(e))
            self._forget(url)
