"""Random small clusters for the simulator's property tests (hypothesis strategies)."""

import dataclasses

from hypothesis import strategies as st

from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.presets import PRESETS

NL2REPO = PRESETS["nl2repo-122b"]


def _small_preset(group_size: int, batch_groups: int):
    return dataclasses.replace(
        NL2REPO,
        group_size=group_size,
        batch_groups=batch_groups,
        executions_per_node=2,
        num_nodes=0,
        rho_min=0.5,
        tau_s=30.0,
    )


@st.composite
def small_layouts(draw):
    mode = draw(st.sampled_from(list(Mode)))
    batch_groups = draw(st.integers(1, 4))
    cells = draw(st.integers(2, 4))
    layout = Layout(
        mode,
        num_cells=cells,
        cell_nodes=draw(st.integers(1, 3)),
        phi=draw(st.integers(0, 2 * batch_groups)) / batch_groups,
        mu=draw(st.integers(1, 3)),
        streaming=draw(st.booleans()),
        separate_pool_nodes=draw(st.integers(0, 2)),
        async_training_cells=draw(st.integers(1, cells - 1)) if mode is Mode.ASYNC else 0,
    )
    return _small_preset(draw(st.integers(1, 4)), batch_groups), layout
