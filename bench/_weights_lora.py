"""`gyre bench weights --lora`: what a publication and a satellite's pull cost when the run trains a LoRA
adapter, against full weights, in the same run on the same model.

Publication (the core's, `cell_agent.trainer.publication: tensor`, the embedded default): write the
published directory (an HF directory, or the PEFT adapter directory), then push it to a rollout engine
(a real embedded engine, over HTTP, as `services.cell_agent.publication.Publisher` does:
`/update_weights_from_tensor`, or the adapter's `/load_lora_adapter_from_tensors` + `/update_weight_version`
+ unloading the stale adapter). Timed from the start of the write to the engine's answer; median of
`--repeats` after one warmup. Bytes: the published directory's files.

Pull (a satellite joining mid-batch): the trained weights' flat buffer (every weight, or the adapter's
matrices) read through the run's weight transport between two processes (`torch`: a broadcast over
the pair's gloo group, the embedded default); median seconds of `--repeats` after one warmup.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from gyre.config.engine import EngineSection
from gyre.config.training import TrainerSection
from gyre.model.init import init_model_dir
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import LoraSpec
from gyre.model.weights import load_model
from gyre.trainer.checkpoint import write_published
from services.cell_agent.engine import EngineServer
from services.cell_agent.publication import Publisher


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


async def _publications(
    model_dir: Path, adapter: LoraAdapter, work: Path, repeats: int
) -> dict[str, tuple[float, int]]:
    """kind → (median seconds, bytes) of a publication: full weights and the adapter."""
    model = load_model(model_dir)
    named = {n: p.detach() for n, p in model.named_parameters()}
    section = EngineSection(enable_lora=True, max_lora_rank=adapter.spec.rank, kv_cache_tokens=1024)
    publisher = Publisher(
        TrainerSection(publication="tensor"),
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        timeout_s=600,
        run_id="bench",
    )
    out: dict[str, tuple[float, int]] = {}
    async with EngineServer(section, model_dir=model_dir) as engine:
        for kind in ("full", "adapter"):
            times: list[float] = []
            size = 0
            for version in range(1, repeats + 2):
                began = time.perf_counter()
                if kind == "full":
                    path = write_published(
                        work / kind, version=version, arch=model.arch, tensors=named, source=model_dir
                    )
                    await publisher.push(engine.url, named, version=version, path=path)
                else:
                    path = write_published(
                        work / kind,
                        version=version,
                        arch=model.arch,
                        tensors=adapter.tensors(),
                        source=model_dir,
                        adapter=adapter,
                    )
                    await publisher.push_adapter(
                        engine.url, adapter, version=version, path=path, base=model_dir
                    )
                if version > 1:  # the first is a warmup
                    times.append(time.perf_counter() - began)
                size = _dir_bytes(path)
            out[kind] = (statistics.median(times), size)
    await publisher.close()
    return out


def lora_adapter(model_dir: Path, rank: int, targets: list[str]) -> LoraAdapter:
    """A rank-`rank` adapter on `targets` with B ≠ 0 (the bytes and the work of a trained one)."""
    arch = load_model(model_dir).arch
    adapter = LoraAdapter(arch, LoraSpec(rank=rank, alpha=2.0 * rank, target_modules=tuple(targets)))
    adapter.init_weights(0)
    with torch.no_grad():
        for b in adapter.lora_B:
            b.normal_(0.0, 0.01)
    return adapter


async def compare(
    model: Path | None, rank: int, targets: list[str], transport: str, repeats: int, work: Path, measure: Any
) -> dict[str, Any]:
    """The JSON fields of `gyre bench weights --lora` (`measure(transport, numels, repeats)` → seconds each)."""
    model_dir = model or init_model_dir(work / "qwen3-small", arch="qwen3", size="small", seed=0)
    adapter = lora_adapter(model_dir, rank, targets)
    num_params = load_model(model_dir).arch.num_parameters()
    published = await _publications(model_dir, adapter, work / "published", repeats)
    numel = {"full": num_params, "adapter": sum(p.numel() for p in adapter.parameters())}
    pulls = dict(zip(numel, measure(transport, list(numel.values()), repeats), strict=True))
    out: dict[str, Any] = {"lora": True}
    for kind in ("full", "adapter"):
        seconds, size = published[kind]
        out[f"{kind}_publication_bytes"] = size
        out[f"{kind}_publication_s"] = round(seconds, 4)
        out[f"{kind}_pull_bytes"] = numel[kind] * 4
        out[f"{kind}_pull_s"] = round(pulls[kind], 5)
    out["publication_bytes_full_vs_adapter"] = round(published["full"][1] / published["adapter"][1], 1)
    out["publication_s_full_vs_adapter"] = round(published["full"][0] / published["adapter"][0], 2)
    out["pull_s_full_vs_adapter"] = round(pulls["full"] / pulls["adapter"], 2)
    out.update(
        model=str(model or f"gyre model init --arch qwen3 --size small ({num_params} parameters)"),
        num_parameters=num_params,
        lora_rank=rank,
        lora_target_modules=targets,
        transport=transport,
        repeats=repeats,
    )
    return out
