"""Hugging Face model directories on disk: which files hold the weights, and a check of them all.

A directory holds `config.json`, `model.safetensors` (or shards listed by
`model.safetensors.index.json`), the tokenizer files and optionally `generation_config.json`.
`check_model_dir` reads only the safetensors headers (a few KB per file) and the file sizes, so a
process refuses a truncated file or a tensor whose shape disagrees with config.json at start, in
milliseconds and without torch, before it builds anything:

    info = check_model_dir(path)      # ModelError: one line naming the file and the field
    info.arch, info.tensors["model.norm.weight"].shape, info.policy_version
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from gyre.model.arch import ModelArch, ModelError, read_arch
from gyre.model.tokenizer import Tokenizer

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
POLICY_VERSION_KEY = "gyre_policy_version"
_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
_IGNORED_TENSORS = (".rotary_emb.inv_freq",)


@dataclass(frozen=True, slots=True)
class TensorEntry:
    file: Path
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What `check_model_dir` found: the architecture, the tensors by name, the safetensors metadata."""

    path: Path
    arch: ModelArch
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]

    @property
    def policy_version(self) -> int | None:
        value = self.metadata.get(POLICY_VERSION_KEY)
        return int(value) if value is not None else None


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a directory: the shards of the index, else model.safetensors."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(index, "weight_map", f"unreadable shard index ({e})") from e
        return [directory / f for f in files]
    single = directory / WEIGHTS_FILE
    if not single.is_file():
        raise ModelError(single, WEIGHTS_FILE, f"missing: no {WEIGHTS_FILE} and no {INDEX_FILE}")
    return [single]


def _read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Tensor entries and metadata of one safetensors file, checking that the data is all there."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(path, "header", "file is truncated (no safetensors header)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                raise ModelError(path, "header", "file is truncated inside its header")
            header = json.loads(f.read(header_len))
    except OSError as e:
        raise ModelError(path, "header", f"unreadable ({e})") from e
    except ValueError as e:
        raise ModelError(path, "header", f"not a safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise ModelError(path, "header", "not a safetensors header (expected a JSON object)")
    metadata = {str(k): str(v) for k, v in (header.pop("__metadata__", None) or {}).items()}
    entries: dict[str, TensorEntry] = {}
    data_size = size - 8 - header_len
    for name, spec in header.items():
        try:
            end = int(spec["data_offsets"][1])
            st_dtype, shape = str(spec["dtype"]), tuple(int(d) for d in spec["shape"])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ModelError(path, name, f"malformed safetensors header entry ({e!r})") from e
        if end > data_size:
            raise ModelError(
                path,
                name,
                f"file is truncated: the tensor's data ends at byte {end}, the file has {data_size}",
            )
        dtype = _ST_DTYPES.get(st_dtype)
        if dtype is None:
            raise ModelError(path, name, f"dtype {st_dtype} is not supported (F32, BF16, F16)")
        entries[name] = TensorEntry(path, dtype, shape)
    return entries, metadata


def check_model_dir(directory: Path) -> ModelInfo:
    """Config, tokenizer and every tensor's name and shape against config.json (headers only)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelError(
            directory, "model.path", "is not a directory (give a Hugging Face checkpoint directory)"
        )
    arch = read_arch(directory)
    Tokenizer.from_dir(directory)
    tensors: dict[str, TensorEntry] = {}
    metadata: dict[str, str] = {}
    for path in weight_files(directory):
        if not path.is_file():
            raise ModelError(path, INDEX_FILE, f"lists shard {path.name}, which is missing")
        entries, meta = _read_header(path)
        tensors.update(entries)
        metadata = metadata or meta
    expected = arch.parameter_shapes()
    for name, shape in expected.items():
        entry = tensors.get(name)
        if entry is None:
            raise ModelError(directory / WEIGHTS_FILE, name, "missing from the checkpoint")
        if entry.shape != shape:
            raise ModelError(
                entry.file,
                name,
                f"shape {list(entry.shape)} disagrees with config.json (expects {list(shape)})",
            )
    for name, entry in tensors.items():
        if name in expected or name.endswith(_IGNORED_TENSORS):
            continue
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue
        raise ModelError(entry.file, name, "is not a parameter of this architecture (config.json)")
    return ModelInfo(directory, arch, tensors, metadata)
