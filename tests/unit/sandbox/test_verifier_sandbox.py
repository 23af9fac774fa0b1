"""The evaluator verifies where the runner's harness ran: a runner launcher whose sandboxes have a filesystem of
their own (`own_filesystem`, a property of the launcher, not a name) needs the evaluator on that launcher too,
refused before anything starts (`gyre up`'s check and each service's)."""

from __future__ import annotations

import pytest

from gyre.config import ConfigError, GyreConfig, load_config
from gyre.sandbox.host import check_verifier_sandbox
from gyre.sandbox.launchers import LAUNCHERS, launcher_class


def _config(runner: str, evaluator: str) -> GyreConfig:
    return load_config(
        None,
        environ={},
        overrides={
            "runner": {"sandbox": {"isolation": runner}},
            "evaluator": {"sandbox": {"isolation": evaluator}},
        },
    )


@pytest.mark.parametrize("runner", list(LAUNCHERS))
@pytest.mark.parametrize("evaluator", list(LAUNCHERS))
def test_a_runner_sandbox_with_its_own_filesystem_needs_the_evaluator_on_the_same_launcher(
    runner: str, evaluator: str
) -> None:
    config = _config(runner, evaluator)  # the config itself is read either way
    if launcher_class(runner).own_filesystem and evaluator != runner:
        with pytest.raises(ConfigError) as refused:
            check_verifier_sandbox(config)
        assert str(refused.value) == (
            f"runner.sandbox.isolation {runner} needs evaluator.sandbox.isolation {runner} too: the verifier "
            f"runs in the execution's sandbox after the harness; got {evaluator!r}"
        )
    else:
        check_verifier_sandbox(config)


def test_the_container_launcher_is_one_that_has_its_own_filesystem() -> None:
    """The test above can fail: at least one registered launcher refuses a different evaluator."""
    assert any(launcher_class(name).own_filesystem for name in LAUNCHERS)
