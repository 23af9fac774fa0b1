"""The supply check's claimable-groups function and its timer."""

from services.scheduler.policy.supply import SupplyTimer, claimable_groups


def test_claimable_groups_is_capped_by_what_the_batch_still_needs():
    assert claimable_groups(ready_unclaimed=20, batch_needs=5, streaming=True) == 5
    assert claimable_groups(ready_unclaimed=3, batch_needs=5, streaming=True) == 3
    assert claimable_groups(ready_unclaimed=3, batch_needs=0, streaming=True) == 0


def test_without_streaming_a_partial_batch_is_not_claimable():
    assert claimable_groups(ready_unclaimed=3, batch_needs=5, streaming=False) == 0
    assert claimable_groups(ready_unclaimed=5, batch_needs=5, streaming=False) == 5


def test_timer_counts_from_the_first_observation_and_clears_on_failure():
    timer = SupplyTimer()
    timer.observe(10.0, True)
    timer.observe(15.0, True)
    assert timer.due_s(30.0) == 40.0
    timer.observe(16.0, False)
    assert timer.due_s(30.0) is None
    timer.observe(17.0, True)
    assert timer.due_s(30.0) == 47.0
    timer.restart(20.0, True)
    assert timer.since_s == 20.0
    timer.restart(21.0, False)
    assert timer.since_s is None
