"""`gyre bench load` end to end at a tiny size: the real proxy, engine, NATS and Redis, saturated steps
then a paced level, and every answered call found in its tree (`lost`). Timings are measured by the
benchmark, not asserted here."""

import json

from typer.testing import CliRunner

from app.cli import app


def test_bench_load_answers_every_call_and_reports_its_fields():
    args = [
        "bench", "load", "--json", "--concurrency", "8", "--steps", "4", "--turns", "2",
        "--tool-s", "0.05", "--group-size", "8",
        "--no-pin",  # in-process here: pinning would pin the test session itself
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # the steps' progress lines go to stderr, which the runner interleaves with stdout in its own order
    report = json.loads(next(x for x in reversed(result.output.splitlines()) if '"by_concurrency"' in x))
    assert report["errors"] == 0 and report["lost"] == 0, report
    assert report["cpu_affinity"] is None
    paced, saturated = report["by_concurrency"]["8"], report["saturated"]
    assert paced["tool_s"] == 0.05 and saturated["tool_s"] == 0.0
    assert paced["calls"] == 8 * 2 and saturated["calls"] == 4 * 8 * 2
    for level in (paced, saturated):
        assert level["proxy_overhead_ms_p50"] is not None and level["proxy_overhead_ms_p99"] is not None
        assert level["cpu_ms_per_call"]["proxy"] > 0 and level["cpu_ms_per_call"]["engine"] > 0
        assert len(level["client_ms_p99_by_turn"]) == 2
    assert report["used_memory_ratio_last_vs_4"] is not None
    clients, used = report["redis_clients_memory_after_step"], report["redis_used_memory_after_step"]
    assert set(clients) == set(used) and all(0 < clients[k] < used[k] for k in used)
    assert report["used_memory_less_clients_ratio_last_vs_4"] > 0
    assert report["events_consumed"] == report["events"] == 2 * 8 * 5
    assert report["redis_bytes_per_execution"] > 0
