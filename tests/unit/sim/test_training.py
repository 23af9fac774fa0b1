"""Micro-step packing and training time."""

from sim.training import TrainingModel


def test_pack_keeps_executions_whole_and_respects_the_budget():
    model = TrainingModel(node_tokens_per_s=1000.0, microstep_tokens=100.0)
    assert model.pack([40, 50, 30, 0, 120, 10]) == [90, 30, 120, 10]
    assert model.pack([0, 0]) == []


def test_seconds_scale_with_nodes():
    model = TrainingModel(node_tokens_per_s=1000.0, microstep_tokens=100.0)
    assert model.seconds(8000.0, nodes=4) == 2.0
    assert (model.join_s, model.leave_s) == (8.52, 3.46)
