"""PolicyParams: validation that names the fix, and its construction from the config section."""

import pytest

from gyre.config import ConfigError, load_config
from gyre.config.scheduler import SchedulerSection
from services.scheduler.params import policy_params
from services.scheduler.policy import Mode, PolicyParams


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rho_min": 1.5}, r"rho_min must be in \(0, 1\]"),
        ({"phi": -1.0}, "phi must be >= 0"),
        ({"mu": 0}, "mu must be at least 1"),
        ({"phi": 0.3, "batch_groups": 4}, "pick phi as a multiple of 1/4"),
        (
            {"mode": Mode.ASYNC, "num_cells": 2, "async_training_cells": 3},
            r"async_training_cells must be in \[1, ",
        ),
        ({"mode": Mode.ASYNC, "num_cells": 2, "async_training_cells": 2}, "needs a separate pool"),
        ({"tau_s": -1.0}, "tau_s must be >= 0"),
    ],
)
def test_bad_parameters_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyParams(**kwargs)


def test_from_section_copies_every_knob():
    section = SchedulerSection(
        mode="colocate",
        num_cells=4,
        group_size=16,
        batch_groups=32,
        phi=0.0,
        mu=4,
        rho_min=0.25,
        tau_s=60.0,
        cell_capacity=144,
        separate_pool_capacity=144,
        async_training_cells=2,
        streaming=False,
    )
    params = policy_params(section)
    assert params == PolicyParams(
        mode=Mode.COLOCATE,
        num_cells=4,
        group_size=16,
        batch_groups=32,
        phi=0.0,
        mu=4,
        rho_min=0.25,
        tau_s=60.0,
        cell_capacity=144,
        separate_pool_capacity=144,
        async_training_cells=2,
        streaming=False,
    )
    assert params.transition_unit == 4
    assert policy_params(load_config(None, environ={}).scheduler).mode is Mode.ELASTIC


def test_config_section_rejects_what_the_policy_would():
    with pytest.raises(ConfigError, match="pick phi as a multiple of 1/4"):
        load_config(None, environ={"GYRE_SCHEDULER__PHI": "0.3"})
    with pytest.raises(ConfigError, match="needs a separate pool"):
        load_config(
            None, environ={"GYRE_SCHEDULER__MODE": "async", "GYRE_SCHEDULER__ASYNC_TRAINING_CELLS": "3"}
        )
    with pytest.raises(ConfigError, match="must be >= 0"):
        load_config(None, environ={"GYRE_SCHEDULER__TAU_S": "-1"})
