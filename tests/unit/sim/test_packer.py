"""The simulated packer: oldest version first, stays just ahead of the cells, streams or waits."""

from sim.packer import SimPacker
from sim.training import TrainingModel

TOKENS = [[10.0, 10.0]] * 8  # each group: one micro-step of 20 tokens
MODEL = TrainingModel(node_tokens_per_s=1.0, microstep_tokens=100.0)


def test_streaming_pulls_oldest_version_first_and_only_below_low_water():
    packer = SimPacker(MODEL, batch_groups=3, streaming=True)
    packer.add_ready(0, dispatch_version=2)
    packer.add_ready(1, dispatch_version=0)
    packer.add_ready(2, dispatch_version=1)
    packer.open(5)
    assert packer.pull(TOKENS, low_water=1) == [1]
    assert packer.pull(TOKENS, low_water=1) == []  # one micro-step waits: enough
    assert packer.claim() == (20.0, 1)
    assert packer.pull(TOKENS, low_water=3) == [2, 0]
    assert packer.closed


def test_without_streaming_the_batch_is_packed_whole():
    packer = SimPacker(MODEL, batch_groups=2, streaming=False)
    packer.open(0)
    packer.add_ready(3, dispatch_version=0)
    assert packer.pull(TOKENS, low_water=10) == []
    packer.add_ready(4, dispatch_version=0)
    assert packer.pull(TOKENS, low_water=10) == [3, 4]
    assert packer.closed and not packer.complete
    packer.claim()
    packer.claim()
    packer.done()
    packer.done()
    assert packer.complete
    packer.finish()
    assert packer.step is None
