"""Loading and writing the weights of Hugging Face model directories (torch side of `gyre.model.files`).

    model = load_model(path)              # CausalLM with the checkpoint's own state dict (fp32 by default)
    write_model_dir(out, arch=model.arch, tensors=named, source=path, metadata={"gyre_policy_version": "4"})

Written directories load with `transformers.AutoModelForCausalLM.from_pretrained` and serve as
SGLang's `--model-path`; Gyre's own metadata (the policy version) rides in the safetensors metadata,
which both ignore.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gyre.durable import replacing_dir
from gyre.model.arch import ModelArch
from gyre.model.causal_lm import CausalLM
from gyre.model.files import INDEX_FILE, WEIGHTS_FILE, ModelInfo, check_model_dir

MAX_SHARD_BYTES = 5 * 1024**3
_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
#: Files of a model directory that are not copied to a written one (weights, config, trainer state).
_NOT_COPIED = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def torch_dtype(name: str) -> torch.dtype:
    if name not in _TORCH_DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; use one of {', '.join(_TORCH_DTYPES)}")
    return _TORCH_DTYPES[name]


def load_state_dict(info: ModelInfo, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint's parameters (HF names, `dtype`, CPU); buffers and tied duplicates are skipped."""
    wanted = info.arch.parameter_shapes()
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(info.tensors[name].file, []).append(name)
    out: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                out[name] = f.get_tensor(name).to(dtype)
    return out


def load_model(directory: Path, dtype: torch.dtype = torch.float32) -> CausalLM:
    """Check the directory, build `CausalLM` and load the checkpoint into it (eval mode)."""
    info = check_model_dir(directory)
    model = CausalLM(info.arch).to(dtype)
    assign_weights(model, load_state_dict(info, dtype))
    return model.eval()


@torch.no_grad()
def assign_weights(model: CausalLM, tensors: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
    """Copy named tensors into the model's parameters (shapes checked; `strict`: all of them)."""
    params = dict(model.named_parameters())
    unknown = sorted(
        set(tensors) - set(params) - ({"lm_head.weight"} if model.arch.tie_word_embeddings else set())
    )
    if unknown:
        raise ValueError(f"weights do not match the model: unexpected {unknown[:3]}")
    if strict and (missing := sorted(set(params) - set(tensors))):
        raise ValueError(f"weights do not match the model: missing {missing[:3]}")
    for name, tensor in tensors.items():
        if name not in params:
            continue
        param = params[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"parameter {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        param.copy_(tensor)


def write_model_dir(
    out: Path,
    *,
    arch: ModelArch,
    tensors: Mapping[str, torch.Tensor],
    source: Path | None,
    metadata: Mapping[str, str] | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write an HF directory atomically (a temporary sibling renamed into place): config.json (the
    source's, with `torch_dtype` set), the weights (sharded above `max_shard_bytes`), and every
    tokenizer / generation file of `source`."""
    target = torch_dtype(dtype) if dtype is not None else None
    host = {
        name: (t.detach().to("cpu", dtype=target) if target is not None else t.detach().to("cpu"))
        .contiguous()
        .clone()
        for name, t in tensors.items()
    }
    dtype_name = dtype or str(next(iter(host.values())).dtype).removeprefix("torch.")
    config = {**arch.raw, "torch_dtype": dtype_name}
    config.pop("dtype", None)
    with replacing_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_shards(tmp, host, {"format": "pt", **(metadata or {})}, max_shard_bytes)
        if source is not None:
            for item in Path(source).iterdir():
                if (
                    item.is_file()
                    and item.name != "config.json"
                    and item.name != INDEX_FILE
                    and not item.name.endswith(_NOT_COPIED)
                ):
                    shutil.copy2(item, tmp / item.name)
    return Path(out)


def _write_shards(
    directory: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], max_bytes: int
) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(directory / WEIGHTS_FILE), metadata=metadata)
        return
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / filename), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
