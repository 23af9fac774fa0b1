"""The `/metrics` listener: the Prometheus text format on GET, OpenMetrics when asked, and a clear plain-text
error (never a crash, never a hang) for everything else."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, Counter

from gyre.metrics import CombinedRegistry, MetricsListener, process_registry, series


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    writer.write_eof()
    reply = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    return reply


async def test_serves_every_registry_and_refuses_the_rest() -> None:
    own = process_registry("packer", "packer", "r1")
    other = CollectorRegistry()
    Counter(series("packer", "groups_packed"), "Groups.", registry=other).inc(3)
    listener = MetricsListener(CombinedRegistry([own, other]), host="127.0.0.1", port=0)
    await listener.start()
    try:
        assert listener.port > 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}") as client:
            ok = await client.get("/metrics")
            assert ok.status_code == 200 and ok.headers["content-type"].startswith(
                "text/plain; version=0.0.4"
            )
            assert 'gyre_packer_info{instance="packer",run="r1"} 1.0' in ok.text
            assert "gyre_packer_groups_packed_total 3.0" in ok.text
            assert "process_cpu_seconds_total" in ok.text and "_created" not in ok.text
            om = await client.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
            assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith(
                "# EOF\n"
            )
            head = await client.head("/metrics")
            assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
            missing = await client.get("/nope")
            assert missing.status_code == 404 and "serves /metrics" in missing.text
            post = await client.post("/metrics", content=b"x")
            assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
        assert (await _raw(listener.port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400 Bad Request")
        assert (await _raw(listener.port, b"GET /metrics HTTP/1.1\r\nno-colon\r\n\r\n")).startswith(
            b"HTTP/1.1 400"
        )
        huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
        assert (await _raw(listener.port, huge)).startswith(b"HTTP/1.1 431")
        assert (
            await _raw(listener.port, b"GET /metr") == b""
        )  # a scraper that hangs up gets nothing, harms nothing
        async with httpx.AsyncClient() as client:  # still serving after all that
            assert (await client.get(f"http://127.0.0.1:{listener.port}/metrics")).status_code == 200
    finally:
        await listener.stop()
        await listener.stop()  # idempotent


async def test_a_taken_port_fails_the_start() -> None:
    first = MetricsListener(CollectorRegistry(), host="127.0.0.1", port=0)
    await first.start()
    try:
        second = MetricsListener(CollectorRegistry(), host="127.0.0.1", port=first.port)
        try:
            await second.start()
        except OSError:
            pass
        else:
            await second.stop()
            raise AssertionError("a second listener bound a taken port")
    finally:
        await first.stop()
