"""A satellite's pulled snapshot is bit-identical to the core's weights of that version, even while
the core keeps changing them: a core process takes optimizer steps back to back while a satellite
process pulls its snapshot through Mooncake over and over; every pull that the sequence lock accepts
must hash to exactly the core's digest of that version (a torn read would raise SnapshotError)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path

import pytest

from app.stack.servers import ServerProcess
from tests.support.snapshot_workers import core_worker, satellite_worker

PULLS = 25


@pytest.mark.slow
def test_snapshot_pulls_are_consistent_while_the_core_steps(
    tmp_path: Path, redis_server: ServerProcess, run_id: str
) -> None:
    ctx = mp.get_context("spawn")
    versions, pulls, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    core = ctx.Process(target=core_worker, args=(redis_server.url, run_id, str(tmp_path), versions, stop))
    satellite = ctx.Process(
        target=satellite_worker, args=(redis_server.url, run_id, str(tmp_path), pulls, stop, PULLS)
    )
    core.start()
    satellite.start()
    reports = []
    try:
        while not reports or reports[-1][0] != "done":
            try:
                reports.append(pulls.get(timeout=1.0))
            except queue.Empty:
                assert satellite.is_alive() and core.is_alive(), "a worker died (its traceback is above)"
    finally:
        stop.set()
    # Drain the core's queue while it exits: a process whose queue still holds unread items cannot
    # finish (its feeder thread blocks on the full pipe), so joining first would deadlock.
    digests: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while (core.is_alive() or not versions.empty()) and time.monotonic() < deadline:
        try:
            version, digest = versions.get(timeout=0.5)
            digests[version] = digest
        except queue.Empty:
            pass
    satellite.join(timeout=30)
    core.join(timeout=30)
    assert [p.exitcode for p in (core, satellite)] == [0, 0]
    assert not [r for r in reports if r[0] == "torn"], reports
    pulled = [(v, d) for _, v, d in (r for r in reports if r[0] == "pulled")]
    _, got, _ = reports[-1]
    assert got == len(pulled) == PULLS
    assert len(digests) > PULLS / 2, "the core must really have been stepping while the satellite pulled"
    for version, digest in pulled:
        assert digest == digests[version], f"pulled version {version} differs from the core's"
    assert len({v for v, _ in pulled}) > 1
