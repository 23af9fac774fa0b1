import dataclasses

import numpy as np
import pytest

from gyre.rl.stream import StreamPacker
from tests.unit.rl.test_packing import check_packing, random_rows, rows_of


def groups(seed, num_groups=5, group_size=4):
    out = []
    for g in range(num_groups):
        rows, advantages = random_rows(seed * 100 + g, group_size, max_len=50)
        rename = {e: f"g{g}-{e}" for e in advantages}
        rows = [dataclasses.replace(r, execution_id=rename[r.execution_id]) for r in rows]
        out.append((rows, {rename[e]: a for e, a in advantages.items()}))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_stream_emits_only_full_microsteps_until_closed(seed):
    budget, min_fill = 120, 0.8
    stream = StreamPacker(
        batch_id="b", step=1, num_batch_executions=20, token_budget=budget, min_fill=min_fill
    )
    emitted = []
    for rows, advantages in groups(seed):
        new = stream.add(rows, advantages)
        assert all(s.num_tokens >= min_fill * budget for s in new)
        emitted.extend(new)
    assert stream.num_emitted == len(emitted)
    emitted.extend(stream.close())
    assert stream.closed and stream.num_buffered_tokens == 0
    all_rows = [r for rows, _ in groups(seed) for r in rows]
    all_advantages = {e: a for _, adv in groups(seed) for e, a in adv.items()}
    check_packing(all_rows, all_advantages, emitted, budget, 20)


def test_stream_packs_fuller_than_packing_each_group_alone():
    from gyre.rl.packing import pack

    budget = 200
    stream = StreamPacker(batch_id="b", step=0, num_batch_executions=40, token_budget=budget)
    streamed, alone = [], []
    for rows, advantages in groups(9, num_groups=10):
        streamed.extend(stream.add(rows, advantages))
        alone.extend(pack(rows, advantages, num_batch_executions=40, token_budget=budget))
    streamed.extend(stream.close())
    assert sum(s.num_tokens for s in streamed) == sum(s.num_tokens for s in alone)
    assert len(streamed) < len(alone)


def test_oversize_execution_is_emitted_at_once():
    stream = StreamPacker(batch_id="b", step=0, num_batch_executions=2, token_budget=30)
    rows = rows_of(np.random.default_rng(0), "big", [20, 20])
    (step,) = stream.add(rows, {"big": 1.0})
    assert step.oversize


def test_an_execution_is_packed_once_per_stream():
    stream = StreamPacker(batch_id="b", step=0, num_batch_executions=2, token_budget=100)
    rows = rows_of(np.random.default_rng(0), "e", [5])
    stream.add(rows, {"e": 1.0})
    with pytest.raises(ValueError, match="already packed"):
        stream.add(rows, {"e": 1.0})


def test_closed_stream_refuses_groups():
    stream = StreamPacker(batch_id="b", step=0, num_batch_executions=2, token_budget=100)
    assert stream.close() == []
    assert stream.close() == []
    with pytest.raises(ValueError, match="closed"):
        stream.add([], {})


@pytest.mark.parametrize(
    "kwargs", [{"num_batch_executions": 0}, {"token_budget": 0}, {"min_fill": 0.0}, {"min_fill": 1.5}]
)
def test_bad_parameters(kwargs):
    base = {"batch_id": "b", "step": 0, "num_batch_executions": 2, "token_budget": 10}
    with pytest.raises(ValueError):
        StreamPacker(**{**base, **kwargs})
