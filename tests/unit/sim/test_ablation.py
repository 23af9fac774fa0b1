"""Acceptance: on nl2repo-122b the fine-grained elastic layout E0 is the fastest Table 2 row."""

from sim.ablation import TABLE2, run_ablation
from sim.presets import PRESETS


def test_table2_rows_use_the_32_nodes_and_the_papers_targets():
    assert [row.id for row in TABLE2] == ["A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2"]
    assert all(row.layout.num_nodes == 32 for row in TABLE2)
    assert all(row.layout.phi + (row.layout.mu - 1) / 2 == 1.5 for row in TABLE2)
    assert next(row for row in TABLE2 if row.id == "C3").layout.describe() == "16 C / 16 S"


def test_e0_is_the_fastest_configuration():
    outcomes = run_ablation(PRESETS["nl2repo-122b"], steps=12, seed=0)
    by_id = {o.row.id: o for o in outcomes}
    assert by_id["E0"].ratio_vs_e0 == 1.0
    assert min(outcomes, key=lambda o: o.result.total_s).row.id == "E0"
    assert all(o.ratio_vs_e0 > 1.0 for o in outcomes if o.row.id != "E0")
