"""A compact, versioned bytes format for a `MicroStep`: micro-steps travel between processes
through a Redis queue, so they need a format that is small, fast, language-neutral and safe to
decode (no pickle).

Layout (all integers little-endian):

    magic  b"GYMS"      4 bytes
    version             u16     (CODEC_VERSION; a decoder rejects any other)
    reserved            u16     (0)
    header length H     u32
    header              H bytes of UTF-8 JSON: scalars, execution ids, and the array table
                        [{"name", "dtype", "count", "offset"}], offsets relative to the data start
    padding             to a multiple of 8
    data                the arrays, raw little-endian, each starting on an 8-byte boundary

Only what cannot be derived is stored: token ids (uint16 when every id fits, else int32), row
boundaries, the execution of each row, the target mask as a bit set, the behaviour log-prob
(float32) at targets only, and the coefficient once per execution (float64; per target only if a
micro-step ever carries coefficients that vary inside an execution), and for tree rows the
`TreeLayout` (int32: segment lengths and parents, row boundaries in segments; 8 bytes per segment
and 4 per row, a few dozen bytes per execution). Position ids and per-token execution indices are rebuilt on decode. With the byte
tokenizer and a quarter of the tokens being targets, that is about 3 bytes per token.

The policy version that sampled each target is optional, run-length encoded over the targets (int32
values and lengths: one run per stretch of one version, a few per execution); a blob without it decodes
with `behaviour_versions` None (the mismatch is then measured over every target).

The MoE routing of each token (routing replay) is optional too: `routed_experts` [T·W] (one byte per
expert id when every id fits, 255 = not known; else int16), W in the header; a blob without it
decodes with `routed_experts` None.

Version 2 added the tree layout; a version-1 reader would silently train a tree micro-step as path
rows with wrong positions, hence the bump.

    blob = encode_microstep(step)
    same = decode_microstep(blob)
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.model.tree_layout import TreeLayout
from gyre.rl.microstep import MicroStep, path_positions

CODEC_VERSION = 2
MAGIC = b"GYMS"
_PREAMBLE = struct.Struct("<4sHHI")
_ALIGN = 8

_DTYPES: dict[str, np.dtype[Any]] = {
    "i4": np.dtype("<i4"),
    "u2": np.dtype("<u2"),
    "u1": np.dtype("<u1"),
    "i2": np.dtype("<i2"),
    "f4": np.dtype("<f4"),
    "f8": np.dtype("<f8"),
}


class CodecError(ValueError):
    """The bytes are not a micro-step this codec version can read."""


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def _runs(values: npt.NDArray[np.int32]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Run-length encoding: (value of each run, its length); a model call's targets share one version."""
    if len(values) == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(values)) + 1])
    return values[starts].astype(np.int32), np.diff(np.append(starts, len(values))).astype(np.int32)


def encode_microstep(step: MicroStep) -> bytes:
    """Serialize a micro-step (see the module docstring for the layout)."""
    mask = step.target_mask
    ids_code = (
        "u2"
        if step.num_tokens == 0 or (step.input_ids.min() >= 0 and step.input_ids.max() < 1 << 16)
        else "i4"
    )
    target_coefficients = step.coefficients[mask]
    target_execution = step.execution_index[mask]
    per_execution = np.zeros(step.num_executions, dtype=np.float64)
    per_execution[target_execution] = target_coefficients
    if np.array_equal(per_execution[target_execution], target_coefficients):
        coefficients = ("execution_coefficients", "f8", per_execution)
    else:
        coefficients = ("target_coefficients", "f8", target_coefficients)
    arrays: list[tuple[str, str, npt.NDArray[Any]]] = [
        ("input_ids", ids_code, step.input_ids),
        ("cu_seqlens", "i4", step.cu_seqlens),
        ("row_execution", "i4", step.row_execution),
        ("target_bits", "u1", np.packbits(mask, bitorder="little")),
        ("target_behaviour_logprobs", "f4", step.behaviour_logprobs[mask]),
        coefficients,
        ("advantages", "f8", step.advantages),
        ("execution_num_targets", "i4", step.execution_num_targets),
    ]
    if step.behaviour_versions is not None:
        values, lengths = _runs(step.behaviour_versions[mask])
        arrays += [("behaviour_version_values", "i4", values), ("behaviour_version_lengths", "i4", lengths)]
    routing_width = 0
    if step.routed_experts is not None:
        routing = step.routed_experts
        routing_width = routing.shape[1]
        if routing.size == 0 or int(routing.max()) < 255:
            arrays.append(("routed_experts", "u1", np.where(routing < 0, 255, routing).reshape(-1)))
        else:
            arrays.append(("routed_experts", "i2", routing.reshape(-1)))
    if step.tree is not None:
        arrays += [
            ("tree_row_segments", "i4", step.tree.row_segments),
            ("tree_segment_lengths", "i4", step.tree.segment_lengths),
            ("tree_segment_parents", "i4", step.tree.segment_parents),
        ]
    table: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    offset = 0
    for name, code, array in arrays:
        raw = np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()
        table.append({"name": name, "dtype": code, "count": len(array), "offset": offset})
        chunks.append(raw + b"\0" * _pad(len(raw)))
        offset += len(raw) + _pad(len(raw))
    header = json.dumps(
        {
            "batch_id": step.batch_id,
            "step": step.step,
            "index": step.index,
            "token_budget": step.token_budget,
            "num_tokens": step.num_tokens,
            "execution_ids": list(step.execution_ids),
            "routed_experts_width": routing_width,
            "arrays": table,
        },
        separators=(",", ":"),
    ).encode()
    head = _PREAMBLE.pack(MAGIC, CODEC_VERSION, 0, len(header)) + header
    return b"".join([head, b"\0" * _pad(len(head)), *chunks])


def _read_header(blob: bytes) -> tuple[dict[str, Any], int]:
    if len(blob) < _PREAMBLE.size:
        raise CodecError(f"micro-step blob too short ({len(blob)} bytes)")
    magic, version, _reserved, header_len = _PREAMBLE.unpack_from(blob)
    if magic != MAGIC:
        raise CodecError(f"not a micro-step blob (magic {magic!r})")
    if version != CODEC_VERSION:
        raise CodecError(f"micro-step codec version {version}; this reader understands {CODEC_VERSION} only")
    end = _PREAMBLE.size + header_len
    if end > len(blob):
        raise CodecError("micro-step blob truncated inside its header")
    try:
        header = json.loads(blob[_PREAMBLE.size : end])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CodecError(f"micro-step header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise CodecError("micro-step header must be a JSON object")
    return header, end + _pad(end)


def decode_microstep(blob: bytes) -> MicroStep:
    """Inverse of `encode_microstep`; raises `CodecError` (a ValueError) on anything malformed."""
    header, data_start = _read_header(blob)
    try:
        arrays = _read_arrays(blob, header["arrays"], data_start)
        num_tokens = int(header["num_tokens"])
        input_ids = arrays["input_ids"].astype(np.int32)
        cu_seqlens = arrays["cu_seqlens"].astype(np.int32)
        row_execution = arrays["row_execution"].astype(np.int32)
        bits = arrays["target_bits"]
        behaviour = arrays["target_behaviour_logprobs"]
        advantages = arrays["advantages"].astype(np.float64)
        execution_num_targets = arrays["execution_num_targets"].astype(np.int32)
        execution_ids = tuple(str(x) for x in header["execution_ids"])
        batch_id, step, index = str(header["batch_id"]), int(header["step"]), int(header["index"])
        token_budget = int(header["token_budget"])
        tree = (
            TreeLayout(
                arrays["tree_row_segments"].astype(np.int32),
                arrays["tree_segment_lengths"].astype(np.int32),
                arrays["tree_segment_parents"].astype(np.int32),
            )
            if "tree_row_segments" in arrays
            else None
        )
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"micro-step header is missing or mistypes a field: {e}") from e
    _check_rows(num_tokens, input_ids, bits, cu_seqlens, row_execution, len(execution_ids), tree)
    mask = np.unpackbits(bits, count=num_tokens, bitorder="little").astype(np.bool_)
    if len(behaviour) != int(mask.sum()):
        raise CodecError("micro-step behaviour log-probs disagree with the target mask")
    execution_index = np.repeat(row_execution, np.diff(cu_seqlens)).astype(np.int32)
    full_behaviour = np.zeros(num_tokens, dtype=np.float32)
    full_behaviour[mask] = behaviour
    versions = None
    if "behaviour_version_values" in arrays:
        values, lengths = arrays["behaviour_version_values"], arrays.get("behaviour_version_lengths")
        if (
            lengths is None
            or len(values) != len(lengths)
            or np.any(lengths < 1)
            or lengths.sum() != len(behaviour)
        ):
            raise CodecError("micro-step behaviour versions disagree with the target mask")
        versions = np.full(num_tokens, -1, dtype=np.int32)
        versions[mask] = np.repeat(values.astype(np.int32), lengths)
    routed = _routed_experts(arrays, int(header.get("routed_experts_width") or 0), num_tokens)
    try:
        return MicroStep(
            batch_id=batch_id,
            step=step,
            index=index,
            token_budget=token_budget,
            input_ids=input_ids,
            position_ids=path_positions(cu_seqlens, tree),
            cu_seqlens=cu_seqlens,
            target_mask=mask,
            behaviour_logprobs=full_behaviour,
            coefficients=_token_coefficients(arrays, mask, execution_index, len(execution_ids)),
            execution_index=execution_index,
            execution_ids=execution_ids,
            advantages=advantages,
            execution_num_targets=execution_num_targets,
            tree=tree,
            behaviour_versions=versions,
            routed_experts=routed,
        )
    except ValueError as e:
        raise CodecError(f"decoded micro-step is inconsistent: {e}") from e


def _routed_experts(
    arrays: dict[str, npt.NDArray[Any]], width: int, num_tokens: int
) -> npt.NDArray[np.int16] | None:
    raw = arrays.get("routed_experts")
    if raw is None:
        return None
    if width < 1 or len(raw) != num_tokens * width:
        raise CodecError(f"micro-step routing holds {len(raw)} ids, not {num_tokens} tokens of width {width}")
    routed = raw.astype(np.int16)
    if raw.dtype == np.uint8:
        routed[raw == 255] = -1
    return routed.reshape(num_tokens, width)


def _read_arrays(blob: bytes, table: list[dict[str, Any]], data_start: int) -> dict[str, npt.NDArray[Any]]:
    """The arrays the header's table lists, as views of `blob` (each checked to end inside it)."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    for entry in table:
        dtype = _DTYPES[entry["dtype"]]
        count, offset = int(entry["count"]), int(entry["offset"])
        if count < 0 or offset < 0 or data_start + offset + count * dtype.itemsize > len(blob):
            raise CodecError(f"array {entry['name']!r} runs past the end of the blob")
        arrays[entry["name"]] = np.frombuffer(blob, dtype=dtype, count=count, offset=data_start + offset)
    return arrays


def _check_rows(
    num_tokens: int,
    input_ids: npt.NDArray[np.int32],
    bits: npt.NDArray[Any],
    cu_seqlens: npt.NDArray[np.int32],
    row_execution: npt.NDArray[np.int32],
    num_executions: int,
    tree: TreeLayout | None,
) -> None:
    """The token count, the row boundaries, the rows' executions and the tree layout agree."""
    if len(input_ids) != num_tokens or len(bits) != (num_tokens + 7) // 8:
        raise CodecError("micro-step arrays disagree with the token count")
    if (
        len(cu_seqlens) != len(row_execution) + 1
        or np.any(np.diff(cu_seqlens) <= 0)
        or cu_seqlens[-1] != num_tokens
    ):
        raise CodecError("micro-step row boundaries are inconsistent")
    if np.any(row_execution < 0) or np.any(row_execution >= num_executions):
        raise CodecError("micro-step rows refer to executions it does not list")
    if tree is not None and not np.array_equal(tree.cu_seqlens(), cu_seqlens):
        raise CodecError("micro-step tree layout disagrees with its row boundaries")


def _token_coefficients(
    arrays: dict[str, npt.NDArray[Any]],
    mask: npt.NDArray[np.bool_],
    execution_index: npt.NDArray[np.int32],
    num_executions: int,
) -> npt.NDArray[np.float64]:
    """Every token's loss coefficient (0 off the targets): one per execution, spread over its targets, or
    one per target as written."""
    full = np.zeros(len(mask), dtype=np.float64)
    if "execution_coefficients" in arrays and len(arrays["execution_coefficients"]) == num_executions:
        full[mask] = arrays["execution_coefficients"][execution_index[mask]]
    elif "target_coefficients" in arrays and len(arrays["target_coefficients"]) == int(mask.sum()):
        full[mask] = arrays["target_coefficients"]
    else:
        raise CodecError("micro-step coefficients are missing or have the wrong length")
    return full
