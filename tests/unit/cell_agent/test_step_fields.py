"""What the core reports of a step's corrections and mismatch: the StepCompleted fields and its gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gyre.rl.loss import LossMetrics
from gyre.v1 import events_pb2 as ev
from services.cell_agent.metrics import CellAgentMetrics
from services.cell_agent.step_fields import correction_fields


def _metrics(num_mismatch_targets: int) -> LossMetrics:
    return LossMetrics(
        num_targets=20,
        num_executions=4,
        num_clipped_executions=1,
        num_token_masked_tokens=2,
        num_sequence_masked_executions=1,
        num_mismatch_targets=num_mismatch_targets,
        num_mismatch_executions=2 if num_mismatch_targets else 0,
        mismatch_abs_sum=0.1 * num_mismatch_targets,
        mismatch_abs_max=0.3 if num_mismatch_targets else 0.0,
        mismatch_kl_sum=0.004 * num_mismatch_targets,
        num_mismatch_over_bound=1 if num_mismatch_targets else 0,
    )


def test_fields_are_the_merged_means_and_zero_where_nothing_was_measured() -> None:
    fields = correction_fields(_metrics(10))
    assert fields["token_mask_fraction"] == 0.1 and fields["sequence_mask_fraction"] == 0.25
    assert fields["mismatch_kl"] == 0.004 and fields["mismatch_kl_execution"] == 0.02
    assert fields["mismatch_abs_log_ratio_mean"] == 0.1 and fields["mismatch_abs_log_ratio_max"] == 0.3
    assert fields["mismatch_over_bound_fraction"] == 0.1 and fields["num_mismatch_targets"] == 10
    ev.StepCompleted(**fields)  # every key is a field of the event
    stale = correction_fields(_metrics(0))
    assert stale["mismatch_kl"] == 0.0 and stale["num_mismatch_targets"] == 0


def test_the_core_sets_its_gauges_and_keeps_the_last_mismatch_when_a_step_measured_none() -> None:
    registry = CollectorRegistry()
    gauges = CellAgentMetrics(registry, cell=0)
    gauges.step_objective(0.25, correction_fields(_metrics(10)))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"cell": "0", **labels})

    assert value("gyre_cell_agent_step_masked_ratio", mask="clip") == 0.25
    assert value("gyre_cell_agent_step_masked_ratio", mask="token") == 0.1
    assert value("gyre_cell_agent_step_mismatch_kl_nats") == 0.004
    assert value("gyre_cell_agent_step_mismatch_abs_log_ratio", stat="max") == 0.3
    gauges.step_objective(0.0, correction_fields(_metrics(0)))
    assert value("gyre_cell_agent_step_mismatch_kl_nats") == 0.004
