import dataclasses
import json
import struct

import numpy as np
import pytest

from gyre.rl.codec import CODEC_VERSION, CodecError, decode_microstep, encode_microstep
from gyre.rl.packing import pack
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


def assert_same(a, b):
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
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
