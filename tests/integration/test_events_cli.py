"""`gyre events tail --history` prints stored events decoded, one JSON line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.v1 import events_pb2 as ev


async def test_tail_history_prints_decoded_events(
    bus: EventBus, nats_server: ServerProcess, tmp_path: Path
) -> None:
    await bus.publish(ev.GroupReady(group_id="g7", policy_version=3, mean_reward=0.5))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"nats:\n  url: {nats_server.url}\n")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.cli import main; main()",
            "events",
            "tail",
            "--config",
            str(cfg),
            "--run",
            bus.run_id,
            "--history",
            "--count",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 0, out.stderr
    (line,) = [json.loads(x) for x in out.stdout.splitlines()]  # stdout holds the JSON lines and nothing else
    assert line["subject"] == f"gyre.{bus.run_id}.group.ready"
    assert line["type"] == "gyre.v1.GroupReady"
    assert line["event"]["groupId"] == "g7" and line["event"]["policyVersion"] == "3"
