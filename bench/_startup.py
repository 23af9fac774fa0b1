"""What every benchmark starts the same way: its logging and work directory, and the scripted stack.

    def main(argv):                         # a bench's entry: logs on stderr, JSON as the last stdout line
        args = parser.parse_args(argv)
        run_bench("load", lambda work: run(args, work))

    engine_url, proxy = await start_engine_and_proxy(work, config, processes)   # bench load, bench proxy

`start_engine_and_proxy` runs the embedded engine (scripted outputs) and the proxy as their own
processes on the config it writes to `work/gyre.yaml`, the way `gyre up` would, and returns when the
proxy's endpoint file is there; the caller stops what `processes` holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import yaml

from gyre.log import configure_logging
from gyre.model.init import init_model_dir


def run_bench(name: str, body: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """Run `body` in a temporary work directory with logs on stderr (warnings and up); print its result
    as one JSON line, the last line on stdout."""
    configure_logging("auto", "warning")
    with tempfile.TemporaryDirectory(prefix=f"gyre-bench-{name}-") as tmp:
        result = asyncio.run(body(Path(tmp)))
    print(json.dumps(result))


def bench_model(out: Path, tokenizer: str = "byte") -> Path:
    """The demo model's format (byte tokenizer unless told, compact ChatML) with a context that holds
    800 KB histories; the engine's outputs are scripted, so the weights never run."""
    dims = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 64,
        "max_position_embeddings": 4_000_000,
    }
    return init_model_dir(out, arch="llama", tokenizer=tokenizer, family="chatml", overrides=dims)


async def wait_endpoint_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    """The endpoint file a service writes once it serves (`runs/<run>/services/<name>.json`)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear (process exited: {proc.poll()})")
        await asyncio.sleep(0.05)
    return dict(json.loads(path.read_text()))


async def start_engine_and_proxy(
    work: Path, config: dict[str, Any], processes: list[subprocess.Popen[bytes]]
) -> tuple[str, dict[str, Any]]:
    """Start the embedded engine and the proxy on `config` (appended to `processes` as they start);
    returns the engine's URL and the proxy's endpoint file."""
    config_path = work / "gyre.yaml"
    config_path.write_text(yaml.safe_dump(config))
    engine_proc = subprocess.Popen(
        [sys.executable, "-m", "services.cell_agent.engine", "--config", str(config_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    processes.append(engine_proc)
    assert engine_proc.stdout is not None
    engine_url = str(json.loads(await asyncio.to_thread(engine_proc.stdout.readline))["url"])
    return engine_url, await start_proxy(work, config, processes)


async def start_proxy(
    work: Path, config: dict[str, Any], processes: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """Start the proxy on `config` (appended to `processes`); returns its endpoint file."""
    config_path = work / "gyre.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proxy_proc = subprocess.Popen(
        [sys.executable, "-m", "services.proxy", "--config", str(config_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    processes.append(proxy_proc)
    run = config["run"]
    return await wait_endpoint_file(Path(run["dir"]) / run["id"] / "services" / "proxy.json", proxy_proc, 60)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def stop_processes(processes: list[subprocess.Popen[bytes]], timeout_s: float = 15.0) -> None:
    """SIGTERM every process `start_engine_and_proxy` started, then SIGKILL what outlives `timeout_s`."""
    for proc in processes:
        proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
