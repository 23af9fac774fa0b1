import dataclasses
import json
import struct

import numpy as np
import pytest

from gyre.model.tree_layout import TreeLayout
from gyre.rl.codec import CODEC_VERSION, CodecError, decode_microstep, encode_microstep
from gyre.rl.microstep import path_positions
from gyre.rl.packing import pack
from tests.unit.rl.helpers import simulated_rows
from tests.unit.rl.test_packing import random_rows


def steps(seed=0, budget=80):
    rows, advantages = random_rows(seed, 6)
    return pack(
        rows,
        advantages,
        num_batch_executions=24,
        token_budget=budget,
        batch_id="batch-9",
        step=9,
        first_index=4,
    )


def tree_steps(budget=10**6):
    rows, advantages = simulated_rows("tree")
    return pack(rows, advantages, num_batch_executions=4, token_budget=budget, batch_id="b", step=1)


def assert_same(a, b):
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, TreeLayout):
            assert isinstance(y, TreeLayout), field.name
            assert_same(x, y)
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name
            assert np.array_equal(x, y), field.name
        else:
            assert x == y, field.name


@pytest.mark.parametrize("seed", range(5))
def test_round_trip_is_exact(seed):
    for step in steps(seed):
        assert_same(decode_microstep(encode_microstep(step)), step)


def test_round_trip_of_an_empty_microstep():
    empty = pack([], {}, num_batch_executions=1, token_budget=4)
    assert empty == []
    step = steps()[0]
    blank = dataclasses.replace(
        step,
        input_ids=np.zeros(0, np.int32),
        position_ids=np.zeros(0, np.int32),
        cu_seqlens=np.zeros(1, np.int32),
        target_mask=np.zeros(0, bool),
        behaviour_logprobs=np.zeros(0, np.float32),
        coefficients=np.zeros(0),
        execution_index=np.zeros(0, np.int32),
        execution_ids=(),
        advantages=np.zeros(0),
        execution_num_targets=np.zeros(0, np.int32),
        behaviour_versions=np.zeros(0, np.int32),
    )
    assert_same(decode_microstep(encode_microstep(blank)), blank)


def test_encoding_is_compact():
    for step in steps(1, budget=400):
        size = len(encode_microstep(step))
        # 2-byte ids (they fit), 1 mask bit per token, a float32 per target, the rest per row/execution
        payload = 2 * step.num_tokens + step.num_tokens / 8 + 4 * step.num_targets
        index_bytes = 8 * (step.num_rows + 1) + 24 * step.num_executions
        assert size <= payload + index_bytes + 1024  # 1 KiB for preamble, header and alignment


def test_large_token_ids_round_trip():
    step = steps()[0]
    big = dataclasses.replace(step, input_ids=step.input_ids + 150_000)
    decoded = decode_microstep(encode_microstep(big))
    assert_same(decoded, big)
    assert len(encode_microstep(big)) > len(encode_microstep(step))


def test_coefficients_that_vary_inside_an_execution_round_trip():
    step = steps()[0]
    varied = step.coefficients * np.linspace(1.0, 2.0, step.num_tokens)
    odd = dataclasses.replace(step, coefficients=varied)
    assert_same(decode_microstep(encode_microstep(odd)), odd)


def test_wrong_version_is_refused():
    blob = bytearray(encode_microstep(steps()[0]))
    struct.pack_into("<H", blob, 4, CODEC_VERSION + 1)
    with pytest.raises(CodecError, match="version"):
        decode_microstep(bytes(blob))


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b"XXXX" + b[4:],  # magic
        lambda b: b[:5],  # shorter than the preamble
        lambda b: b[:20],  # inside the header
        lambda b: b[: len(b) - 9],  # inside the arrays
        lambda b: b[:12] + b"{" * 8 + b[20:],  # header not JSON
    ],
)
def test_malformed_blobs_raise_codec_error(mangle):
    blob = encode_microstep(steps()[0])
    with pytest.raises(CodecError):
        decode_microstep(mangle(blob))


def rewrite_header(blob, edit):
    """Re-frame `blob` with its JSON header changed by `edit` (data kept, realigned)."""
    magic, version, reserved, header_len = struct.unpack_from("<4sHHI", blob)
    header = json.loads(blob[12 : 12 + header_len])
    data = blob[12 + header_len + (-(12 + header_len)) % 8 :]
    edit(header)
    raw = json.dumps(header).encode()
    head = struct.pack("<4sHHI", magic, version, reserved, len(raw)) + raw
    return head + b"\0" * ((-len(head)) % 8) + data


def test_rewrite_header_without_edit_still_decodes():
    step = steps()[0]
    assert_same(decode_microstep(rewrite_header(encode_microstep(step), lambda h: None)), step)


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["execution_ids"].pop(),  # fewer executions than rows refer to
        lambda h: h.update(num_tokens=h["num_tokens"] + 1),
        lambda h: h["arrays"][0].update(count=10**9),  # runs past the end
        lambda h: h["arrays"][0].update(dtype="q8"),  # unknown dtype
        lambda h: h.pop("step"),
        lambda h: h.update(num_tokens="many"),
        lambda h: h.update(arrays=7),
        lambda h: h["arrays"].pop(),  # a missing array
    ],
)
def test_inconsistent_content_raises_codec_error(edit):
    blob = rewrite_header(encode_microstep(steps()[0]), edit)
    with pytest.raises(CodecError):
        decode_microstep(blob)


@pytest.mark.parametrize("budget", [10**6, 3000])
def test_round_trip_of_tree_rows_is_exact(budget):
    steps = tree_steps(budget)
    assert any(s.tree is not None for s in steps)
    for step in steps:
        decoded = decode_microstep(encode_microstep(step))
        assert_same(decoded, step)
        assert (decoded.tree is None) == (step.tree is None)


def test_tree_rows_cost_a_few_bytes_per_segment():
    (step,) = tree_steps()
    # the same tokens read as path rows: the difference is the layout alone
    flat = dataclasses.replace(step, tree=None, position_ids=path_positions(step.cu_seqlens, None))
    layout_bytes = len(encode_microstep(step)) - len(encode_microstep(flat))
    assert 0 < layout_bytes <= 12 * step.tree.num_segments + 4 * (step.num_rows + 1) + 256
    assert len(encode_microstep(step)) < 0.8 * len(encode_microstep(step.as_path_rows()))


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: next(a for a in h["arrays"] if a["name"] == "tree_segment_lengths").update(count=1),
        lambda h: h["arrays"].remove(next(a for a in h["arrays"] if a["name"] == "tree_segment_parents")),
        lambda h: next(a for a in h["arrays"] if a["name"] == "tree_row_segments").update(count=1),
    ],
)
def test_inconsistent_tree_layout_raises_codec_error(edit):
    (step,) = tree_steps()
    with pytest.raises(CodecError):
        decode_microstep(rewrite_header(encode_microstep(step), edit))


def test_a_tree_that_is_not_in_tree_order_raises_codec_error():
    (step,) = tree_steps()
    blob = bytearray(encode_microstep(step))
    (header_len,) = struct.unpack_from("<I", blob, 8)
    header = json.loads(blob[12 : 12 + header_len])
    data_start = 12 + header_len + (-(12 + header_len)) % 8
    entry = next(a for a in header["arrays"] if a["name"] == "tree_segment_parents")
    struct.pack_into("<i", blob, data_start + entry["offset"], 3)  # the first segment gets a parent
    with pytest.raises(CodecError, match="root"):
        decode_microstep(bytes(blob))


def test_behaviour_versions_round_trip_as_runs_and_are_optional():
    step = steps()[0]
    versions = np.where(step.target_mask, np.arange(step.num_tokens) // 7 % 3 + 4, -1).astype(np.int32)
    varied = dataclasses.replace(step, behaviour_versions=versions)
    assert_same(decode_microstep(encode_microstep(varied)), varied)
    unrecorded = dataclasses.replace(step, behaviour_versions=None)
    assert decode_microstep(encode_microstep(unrecorded)).behaviour_versions is None
