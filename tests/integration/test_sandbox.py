"""Sandbox acceptance through the runner: a fork bomb, a memory hog and a network probe are
contained and reported, and the runner and the machine stay healthy afterwards."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre import procs
from gyre.bus import EventBus
from gyre.store import Keys
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.runner.service import RunnerService
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, dispatch_group, run_config, write_task
from tests.support.scripted_anthropic import ScriptedAnthropic, text

pytestmark = pytest.mark.slow  # real services and sandboxes: several seconds per test

UID_BASE = 140000
NET_PROBE = """
import socket, sys
def probe(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
with open("net.txt", "w") as f:
    f.write("external=" + probe("1.1.1.1", 80) + "\\n")
    f.write("host_redis=" + probe("127.0.0.1", int(sys.argv[1])) + "\\n")
    f.write("proxy=" + probe("127.0.0.1", int(sys.argv[2])) + "\\n")
external = probe("1.1.1.1", 80)
if external != "open":
    sys.exit("external network blocked: " + external)
"""


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    with ScriptedAnthropic(lambda request: text("hi")) as api:
        async with ProxyStub(api.base_url) as stub:
            yield stub


def sandbox_uids_in_use() -> list[int]:
    return [pid for uid in range(UID_BASE, UID_BASE + 4) for pid in procs.pids_of_uid(uid)]


async def test_fork_bomb_memory_hog_and_network_probe_are_contained(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    tasks = tmp_path / "tasks"
    (tasks / "net").mkdir(parents=True)
    (tasks / "net" / "workspace").mkdir()
    (tasks / "net" / "workspace" / "probe.py").write_text(NET_PROBE)
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    proxy_port = int(proxy.base_url.rsplit(":", 1)[1])
    bomb = write_task(tasks, "bomb", ":(){ :|:& };:; sleep 60", ["true"], harness_timeout_s=3)
    hog = write_task(tasks, "hog", "python3 -c 'x = bytearray(2 * 1024 ** 3)'", ["true"])
    net = write_task(tasks, "net", f"python3 probe.py {redis_port} {proxy_port}", ["true"])
    after = write_task(tasks, "after", "echo ok > ok.txt", ["true"])
    config = run_config(
        run_id,
        tmp_path / "runs",
        nats_server.url,
        redis_server.url,
        proxy.port,
        tasks={"dirs": [str(tasks)]},
        runner={
            "harness": "command",
            "command": ["bash", "-c", "{prompt}"],
            "max_concurrent": 4,
            "sandbox": {"uid_base": UID_BASE, "max_processes": 64, "memory_mb": 512, "kill_grace_s": 1.0},
        },
    )
    events = await EventLog.attach(bus)
    async with RunnerService(config):
        for group, task in (("bomb", bomb), ("hog", hog), ("net", net)):
            await dispatch_group(bus, redis, keys, group, task, 1)
        terms = {
            e.execution.group_id: e for e in await events.wait_for(ev.ExecutionTerminated, 3, timeout_s=60)
        }
        assert sandbox_uids_in_use() == []  # every sandbox process is gone once its execution ended
        # The runner is still healthy: a plain execution afterwards completes.
        await dispatch_group(bus, redis, keys, "after", after, 1)
        (ok,) = await events.wait_for(ev.ExecutionTerminated, where=lambda e: e.execution.group_id == "after")
    assert ok.reason == cm.TERMINATION_REASON_COMPLETED
    assert (Path(ok.workspace.path) / "ok.txt").read_text() == "ok\n"

    assert terms["bomb"].reason == cm.TERMINATION_REASON_HARNESS_TIMEOUT
    assert "Resource temporarily unavailable" in terms["bomb"].detail  # fork refused at the process limit
    assert terms["hog"].reason == cm.TERMINATION_REASON_FAILED and "MemoryError" in terms["hog"].detail
    assert terms["net"].reason == cm.TERMINATION_REASON_FAILED
    assert "external network blocked" in terms["net"].detail and "unreachable" in terms["net"].detail
    probes = dict(
        line.split("=", 1)
        for line in (Path(terms["net"].workspace.path) / "net.txt").read_text().splitlines()
    )
    assert "unreachable" in probes["external"]
    assert probes["host_redis"].startswith(
        "ConnectionRefusedError"
    )  # the host's loopback is not the sandbox's
    assert probes["proxy"] == "open"  # only the relayed proxy is reachable
    # The machine stays healthy: this process can still fork and nothing of the sandboxes is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert sandbox_uids_in_use() == [] and os.getloadavg()[0] < 100
