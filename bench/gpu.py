"""The prepared GPU check: what only a CUDA machine can show about the cluster path, in one script.

    gyre bench gpu [--model DIR] [--microsteps 8] [--token-budget 1024] [--json]
    gyre bench gpu --rehearse-on-cpu        # the same script on CPU (float32, gloo): checks the script

Without CUDA it prints `{"cuda": false, ...}` and exits 0 (nothing else runs). With CUDA, three parts,
each reported on its own (a part that raises records its error and the script exits 1), well under
5 minutes on one GPU:

1. `backends`: the megatron backend (megatron-core GPTModel, Megatron DDP buffers and its
   DistributedOptimizer: the path CPU machines cannot run) and the torch backend on the same tiny
   Qwen3 (`--model`, default `gyre model init --arch qwen3 --size tiny`) in bfloat16 on cuda:0: the
   largest per-token log-prob difference between them and against a float32 CPU reference, and
   micro-steps/s, tokens/s and optimizer-step seconds of each (`benchmark_microsteps`).
2. `role_switch`: the megatron trainer's state (parameters, gradients, fp32 master weights, Adam
   state: `state_tensors()`) released to pinned host memory and restored (`gyre.trainer.offload`):
   `torch.cuda.memory_allocated()` before, released and restored, seconds each way, the weights'
   digest equal afterwards and one more training step after the restore.
3. `process_groups`: the cells' process groups over NCCL (`gyre.trainer.collectives.CellGroups`, one process per
   GPU, at most 4): every prefix group's gradient reduction and parameter broadcast checked and timed
   on 64 MiB. With one GPU that is a world of one (NCCL initializes and all-reduces; no prefix group of
   two exists), and the JSON says so.

`--rehearse-on-cpu` runs all three parts on CPU (float32, gloo, two processes for the groups, allocated
bytes counted from the offloaded storages) so the script itself is exercised where no GPU exists; the
CUDA-only code (Megatron's DDP/DistributedOptimizer, NCCL, pinned copies) is what it cannot reach.

Carrying it to a GPU machine: README "Installing on a GPU cluster" (the CUDA torch build, then
`pip install -e '.[gpu]'`); nothing else is needed (the tiny model is generated on the spot).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

NCCL_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class ComputeTarget:
    """Where the check runs: cuda:0 in bfloat16 over NCCL, or its CPU rehearsal."""

    device: str
    dtype: str
    backend: str

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self, tensors: list[torch.Tensor]) -> int:
        """Device bytes in use: the CUDA allocator's count, or on CPU the bytes of `tensors`' storages."""
        if self.cuda:
            return int(torch.cuda.memory_allocated())
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


CUDA = ComputeTarget("cuda:0", "bfloat16", "nccl")
REHEARSAL = ComputeTarget("cpu", "float32", "gloo")


def _part(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"ok": True, **fn()}
    except Exception as e:  # reported in the JSON: the other parts still run
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}


def _trainers(model: Path, target: ComputeTarget) -> tuple[Any, Any]:
    from gyre.config.training import TrainerSection
    from gyre.rl.loss import ObjectiveParams
    from gyre.trainer.backends import TrainerSpec, create_trainer

    section = {"device": target.device, "dtype": target.dtype}
    make = lambda name: create_trainer(  # noqa: E731
        name,
        TrainerSpec(TrainerSection(backend=name, **section), model, ObjectiveParams(), True),
    )
    return make("megatron"), make("torch")


def _target_logprobs(logits_fn: Callable[..., torch.Tensor], step: Any, device: str) -> torch.Tensor:
    from gyre.rl.step_loss import target_logprobs

    ids = torch.as_tensor(step.input_ids, dtype=torch.int64, device=device)
    pos = torch.as_tensor(step.position_ids, dtype=torch.int64, device=device)
    cu = torch.as_tensor(step.cu_seqlens, dtype=torch.int32, device=device)
    targets = torch.as_tensor(step.target_mask.nonzero()[0], dtype=torch.int64, device=device)
    sources = (
        targets - 1
        if step.tree is None
        else torch.as_tensor(step.tree.predecessors(), device=device)[targets]
    )
    with torch.no_grad():
        return (
            target_logprobs(logits_fn(ids, pos, cu, step.tree).float(), ids, targets, sources).double().cpu()
        )


def _backends(model: Path, steps: list[Any], state: dict[str, Any], target: ComputeTarget) -> dict[str, Any]:
    from gyre.model.weights import load_model
    from gyre.trainer.backends.megatron.bench import benchmark_microsteps

    megatron, torch_trainer = _trainers(model, target)
    state["megatron"] = megatron
    reference = load_model(model)  # float32, CPU
    worst_pair = worst_megatron = worst_torch = 0.0
    for step in steps:
        ref = _target_logprobs(reference, step, "cpu")
        a = _target_logprobs(megatron.logits, step, target.device)
        b = _target_logprobs(torch_trainer.model, step, target.device)
        worst_pair = max(worst_pair, float((a - b).abs().max()))
        worst_megatron = max(worst_megatron, float((a - ref).abs().max()))
        worst_torch = max(worst_torch, float((b - ref).abs().max()))
    out: dict[str, Any] = {
        "dtype": target.dtype,
        "logprob_max_abs_diff_megatron_vs_torch": worst_pair,
        "logprob_max_abs_diff_megatron_vs_fp32_cpu": worst_megatron,
        "logprob_max_abs_diff_torch_vs_fp32_cpu": worst_torch,
        "num_targets": int(sum(s.num_targets for s in steps)),
    }
    for name, trainer in (("megatron", megatron), ("torch", torch_trainer)):
        measured = benchmark_microsteps(trainer, steps)
        target.synchronize()
        out[name] = {k: measured[k] for k in ("microsteps_per_s", "tokens_per_s", "optimizer_step_s")}
    out["megatron_vs_torch"] = out["megatron"]["microsteps_per_s"] / out["torch"]["microsteps_per_s"]
    out["megatron_store"] = type(megatron.store).__name__
    return out


def _digest(weights: torch.Tensor) -> str:
    """SHA-256 of a copy (`weights_digest` shares a CPU buffer with numpy, which pins its storage)."""
    from gyre.trainer.flat import weights_digest

    return weights_digest(weights.detach().to("cpu", copy=True))


def _role_switch(state: dict[str, Any], steps: list[Any], target: ComputeTarget) -> dict[str, Any]:
    from gyre.trainer.offload import StateOffload

    trainer = state.get("megatron")
    if trainer is None:
        raise RuntimeError("the megatron trainer was not built (see backends)")
    digest = _digest(trainer.flat_params)
    tensors = trainer.state_tensors()
    target.synchronize()
    before = target.allocated(tensors)
    offload = StateOffload(tensors)
    t0 = time.perf_counter()
    offload.release()
    release_s = time.perf_counter() - t0
    released = target.allocated(tensors)
    t0 = time.perf_counter()
    offload.restore()
    restore_s = time.perf_counter() - t0
    restored = target.allocated(tensors)
    same = _digest(trainer.flat_params) == digest
    trainer.zero_grads()
    trainer.accumulate(steps[0])
    trainer.optimizer_step()
    return {
        "state_bytes": offload.nbytes,
        "allocated_bytes_before": before,
        "allocated_bytes_released": released,
        "allocated_bytes_restored": restored,
        "freed_bytes": before - released,
        "release_s": release_s,
        "restore_s": restore_s,
        "digest_equal_after_restore": same,
        "stepped_after_restore": trainer.version == 2,
    }


def _group_rank(rank: int, world: int, port: int, target: ComputeTarget, results: Any) -> None:
    import torch.distributed as dist

    from gyre.trainer.collectives import CellGroups, connect_store, host_store

    try:
        device = f"cuda:{rank}" if target.cuda else "cpu"
        if target.cuda:
            torch.cuda.set_device(rank)
        hosted = (
            host_store(bind_host="127.0.0.1", port=port, world_size=world, timeout_s=60)
            if rank == 0
            else None
        )
        store = (
            hosted.store
            if hosted
            else connect_store(host="127.0.0.1", port=port, world_size=world, timeout_s=60)
        )
        groups = CellGroups.initialize(
            store, cell=rank, num_cells=world, backend=target.backend, timeout_s=60
        )
        numel = NCCL_BYTES // 4
        report: dict[str, Any] = {"prefix_groups": []}
        if world == 1:
            t = torch.ones(numel, device=device)
            dist.all_reduce(t)
            target.synchronize()
            report["world_of_one_all_reduce_ok"] = bool(torch.all(t == 1))
        for n in range(2, world + 1):
            grads = torch.full((numel,), float(rank + 1), device=device)
            params = torch.full((numel,), 7.0 if rank == 0 else 0.0, device=device)
            dist.barrier()
            t0 = time.perf_counter()
            if rank < n:
                groups.reduce_to_core(grads, n)
                groups.broadcast_from_core(params, n)
            target.synchronize()
            seconds = time.perf_counter() - t0
            ok = rank >= n or (
                bool(torch.all(params == 7.0)) and (rank != 0 or bool(torch.all(grads == n * (n + 1) / 2)))
            )
            report["prefix_groups"].append({"cells": n, "ok": ok, "reduce_and_broadcast_s": seconds})
        results.put((rank, report))
        dist.destroy_process_group()
    except Exception as e:
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def _groups(target: ComputeTarget) -> dict[str, Any]:
    import socket

    world = min(torch.cuda.device_count(), 4) if target.cuda else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_group_rank, args=(r, world, port, target, results)) for r in range(world)]
    for p in procs:
        p.start()
    reports = dict(results.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    if errors:
        raise RuntimeError(f"{target.backend} ranks failed: {errors}")
    core = reports[0]
    ok = all(g["ok"] for rep in reports.values() for g in rep["prefix_groups"])
    return {"backend": target.backend, "world_size": world, "all_ok": ok, **core, "bytes": NCCL_BYTES}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF model directory (default: a tiny Qwen3)")
    parser.add_argument("--microsteps", type=int, default=8)
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument(
        "--rehearse-on-cpu", action="store_true", help="run every part on CPU (float32, gloo)"
    )
    args = parser.parse_args(argv)
    base: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    target = REHEARSAL if args.rehearse_on_cpu else CUDA
    if not torch.cuda.is_available() and not args.rehearse_on_cpu:
        print(
            json.dumps({"cuda": False, **base, "reason": "torch.cuda.is_available() is false: nothing ran"})
        )
        return
    from gyre.model.init import init_model_dir
    from gyre.model.weights import load_model
    from gyre.trainer.synthetic import synthetic_microsteps

    started = time.perf_counter()
    out: dict[str, Any] = {
        "cuda": target.cuda,
        **base,
        "rehearsal_on_cpu": not target.cuda,
        "device": torch.cuda.get_device_name(0) if target.cuda else "cpu",
        "num_gpus": torch.cuda.device_count() if target.cuda else 0,
        "megatron_core": _version("megatron-core"),
        "transformer_engine": _version("transformer-engine"),
    }
    state: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gyre-bench-gpu-") as tmp:
        model = args.model or init_model_dir(Path(tmp) / "model", arch="qwen3", size="tiny")
        steps = synthetic_microsteps(
            load_model(model),
            batch_id="b0",
            step=0,
            num_groups=8,
            group_size=4,
            token_budget=args.token_budget,
            min_row_tokens=args.token_budget // 8,
            max_row_tokens=args.token_budget // 2,
        )[: args.microsteps]
        out["model"] = str(args.model or "gyre model init --arch qwen3 --size tiny")
        out["backends"] = _part(lambda: _backends(model, steps, state, target))
        out["role_switch"] = _part(lambda: _role_switch(state, steps, target))
        out["process_groups"] = _part(lambda: _groups(target))
    out["wall_s"] = time.perf_counter() - started
    ok = all(out[k]["ok"] for k in ("backends", "role_switch", "process_groups"))
    out["all_ok"] = ok
    print(json.dumps(out))
    if not ok:
        raise SystemExit(1)


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
