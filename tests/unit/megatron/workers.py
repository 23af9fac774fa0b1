"""Process bodies of the megatron tests (spawned: a fresh interpreter per rank, like a cell's TP ranks).

Each rank builds the megatron trainer on its TP shard of the same HF directory, and the transformers
reference, and reports numbers (differences, flags) for the test to assert on."""

from __future__ import annotations

import os
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gyre.config.training import TrainerSection
from gyre.model.arch import arch_from_config
from gyre.model.files import check_model_dir
from gyre.model.weights import load_state_dict
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.trainer.backends.base import TrainerSpec
from gyre.trainer.collectives import connect_store, host_store
from tests.unit.megatron.helpers import batch, hf_packed_logits, hf_reference, hf_reference_step, hf_tensors

_KEEP: list[Any] = []
LR = 1e-3
GRAD_CLIP = 0.05
# AdamW's first step is lr·g/(|g|+ε): with ε = 1e-8 it is lr·sign(g), which flips for gradient entries
# at the level of float32 rounding (both models agree on gradients to ~1e-6 relative); an ε near the
# clipped gradients' scale keeps the step a well-conditioned function of the gradient.
ADAM_EPS = 1e-4


def _join_world(rank: int, world: int, ports: Queue[Any]) -> None:
    if rank == 0:
        hosted = host_store(bind_host="127.0.0.1", port=0, world_size=world, timeout_s=60)
        _KEEP.append(hosted)
        for _ in range(world - 1):
            ports.put(hosted.port)
        store = hosted.store
    else:
        store = connect_store(host="127.0.0.1", port=ports.get(timeout=60), world_size=world, timeout_s=60)
        _KEEP.append(store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def _spec(directory: Path, **section: Any) -> TrainerSpec:
    return TrainerSpec(
        TrainerSection(backend="megatron", **section),
        directory,
        ObjectiveParams(),
        with_optimizer=True,
    )


def _trainer(
    directory: Path, tp_group: dist.ProcessGroup | None, *, version: int | None = 0, **section: Any
) -> Any:
    from gyre.trainer.backends.megatron.trainer import MegatronTrainer

    info = check_model_dir(directory)
    return MegatronTrainer(
        _spec(directory, **section),
        info.arch,
        load_state_dict(info),
        tp_group=tp_group,
        version=version,
        source=directory,
    )


def _family_report(
    family: str, directory: Path, tp_group: dist.ProcessGroup | None, root: Path
) -> dict[str, Any]:
    reference = hf_reference(directory)
    tensors = hf_tensors(reference)
    steps = batch(directory)
    # chunk_tokens below the largest micro-step: those take the two-pass chunked path here, one pass in
    # the reference, and must give the same step.
    trainer = _trainer(directory, tp_group, lr=LR, grad_clip=GRAD_CLIP, adam_eps=ADAM_EPS, chunk_tokens=64)
    report: dict[str, Any] = {"family": family, "num_microsteps": len(steps)}

    back = trainer.named_weights()
    report["roundtrip_exact"] = sorted(back) == sorted(tensors) and all(
        torch.equal(back[k], tensors[k]) for k in back
    )

    logprob_diff = 0.0
    with torch.no_grad():
        for s in steps:
            ids, pos = (
                torch.as_tensor(s.input_ids, dtype=torch.int64),
                torch.as_tensor(s.position_ids, dtype=torch.int64),
            )
            cu = torch.as_tensor(s.cu_seqlens, dtype=torch.int32)
            targets = torch.as_tensor(s.target_mask.nonzero()[0])
            mine = torch.log_softmax(trainer.logits(ids, pos, cu, None).double(), -1)[
                targets - 1, ids[targets]
            ]
            ref = torch.log_softmax(hf_packed_logits(reference, ids, cu).double(), -1)[
                targets - 1, ids[targets]
            ]
            logprob_diff = max(logprob_diff, float((mine - ref).abs().max()))
    report["logprob_max_abs_diff"] = logprob_diff

    trainer.zero_grads()
    results = [trainer.accumulate(s) for s in steps]
    report["loss"] = sum(r.metrics.loss for r in results)
    report["max_chunks"] = max(r.num_chunks for r in results)
    report["norm"] = trainer.optimizer_step()
    report["version"] = trainer.version
    report["reference_norm"] = hf_reference_step(
        reference, steps, lr=LR, adam_eps=ADAM_EPS, grad_clip=GRAD_CLIP, objective=ObjectiveParams()
    )
    after, want = trainer.named_weights(), hf_tensors(reference)
    report["param_max_rel_diff"] = max(
        float((after[k] - want[k]).abs().max() / want[k].abs().max()) for k in want
    )
    report["param_max_rel_moved"] = max(
        float((want[k] - tensors[k]).abs().max() / want[k].abs().max()) for k in want
    )
    report["params_close"] = all(torch.allclose(after[k], want[k], rtol=1e-5, atol=1e-7) for k in want)

    path = trainer.save_checkpoint(root)
    again = _trainer(directory, tp_group, version=None, lr=LR)
    again.load_checkpoint(path)
    report["checkpoint_files"] = sorted(p.name for p in path.iterdir())
    report["checkpoint_restored"] = again.version == trainer.version and torch.equal(
        again.flat_params, trainer.flat_params
    )
    state_a, state_b = trainer.store.optimizer_state()["state"], again.store.optimizer_state()["state"]
    report["optimizer_restored"] = all(
        torch.equal(state_a[i]["exp_avg_sq"], state_b[i]["exp_avg_sq"]) for i in state_a
    )
    return report


def _tree_report(
    directory: Path, tree_step: MicroStep, path_step: MicroStep, tp_group: dist.ProcessGroup | None
) -> dict[str, Any]:
    """One tree-packed micro-step against its paths: same gradient, same loss."""
    trainer = _trainer(directory, tp_group)
    grads = []
    losses = []
    for step in (path_step, tree_step):
        trainer.zero_grads()
        losses.append(trainer.accumulate(step).metrics.loss)
        grads.append(trainer.flat_grads.clone())
    return {
        "grad_max_abs": float(grads[0].abs().max()),
        "grad_max_diff": float((grads[1] - grads[0]).abs().max()),
        "loss_paths": losses[0],
        "loss_tree": losses[1],
    }


def trainer_worker(
    rank: int, world: int, job: dict[str, Any], ports: Queue[Any], results: Queue[Any], root: str
) -> None:
    """`job`: {"families": {name: dir}, "tree": (dir, tree_step, path_step), "bad_llama": config dict}."""
    torch.set_num_threads(1)
    exitcode = 1
    try:
        from gyre.trainer.backends.megatron.trainer import MegatronTrainer

        before = dist.is_initialized()
        try:
            MegatronTrainer(_spec(Path(root)), arch_from_config(job["bad_llama"]), {})
            refused = ""
        except ValueError as e:
            refused = str(e)
        results.put(
            (
                rank,
                "bad_input",
                {"message": refused, "dist_before": before, "dist_after": dist.is_initialized()},
            )
        )
        tp_group = None
        if world > 1:
            _join_world(rank, world, ports)
            tp_group = dist.group.WORLD
        directory, tree_step, path_step = job["tree"]
        results.put((rank, "tree", _tree_report(Path(directory), tree_step, path_step, tp_group)))
        for family, directory in job["families"].items():
            results.put(
                (
                    rank,
                    "family",
                    _family_report(family, Path(directory), tp_group, Path(root) / "checkpoints"),
                )
            )
        results.put((rank, "done", {}))
        exitcode = 0
    except BaseException as e:  # the test process must hear about it instead of timing out
        results.put((rank, "error", {"error": f"{type(e).__name__}: {e}"}))
    finally:
        results.close()
        results.join_thread()
        if dist.is_initialized():
            dist.destroy_process_group()
        os._exit(exitcode)  # skip interpreter teardown (gloo threads); the queue is flushed above
