"""The SGLang launcher: command construction from config, and supervision of a stand-in server.

Supervision is exercised here with a stand-in `sglang.launch_server` module (put on PYTHONPATH) that
serves `/health` on the port it is given and starts in a fraction of a second; the real SGLang (26–45 s
to start on these CPUs) is launched by tests/integration/test_engine_backends.py and test_sglang_server.py."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.engine.sglang_launcher import SGLangLauncher, build_sglang_command
from tests.support.eventually import eventually

STAND_IN = """
import argparse, http.server, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--host")
args, _ = parser.parse_known_args()
if os.environ.get("STAND_IN_ARGV_FILE"):
    with open(os.environ["STAND_IN_ARGV_FILE"], "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\\n")
if os.environ.get("STAND_IN_EXIT_CODE"):
    sys.exit(int(os.environ["STAND_IN_EXIT_CODE"]))
once = os.environ.get("STAND_IN_FAIL_ONCE_FILE")
if once and not os.path.exists(once):
    open(once, "w").close()
    sys.exit(3)  # uvicorn's STARTUP_FAILURE, as when the port was taken
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer((args.host, args.port), Handler).serve_forever()
"""


def sglang_section(**overrides: object) -> EngineSection:
    return EngineSection(**{"backend": "sglang", "sglang_model_path": "Qwen/Qwen3-8B", **overrides})


def test_command_carries_the_config() -> None:
    section = sglang_section(sglang_tp_size=4, sglang_mem_fraction_static=0.8, seed=3, weight_version="12")
    cmd = build_sglang_command(section, port=30001)
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    assert (
        "--model-path Qwen/Qwen3-8B" in joined and "--host 127.0.0.1" in joined and "--port 30001" in joined
    )
    assert "--tp-size 4" in joined and "--mem-fraction-static 0.8" in joined
    assert "--random-seed 3" in joined and "--weight-version 12" in joined
    assert "--enable-memory-saver" in cmd and "--incremental-streaming-output" in cmd


def test_command_serves_lora_adapters_when_enabled() -> None:
    plain = build_sglang_command(sglang_section(), port=1)
    assert "--enable-lora" not in plain
    section = sglang_section(enable_lora=True, max_lora_rank=16, lora_target_modules=["q_proj", "v_proj"])
    joined = " ".join(build_sglang_command(section, port=1))
    assert (
        "--enable-lora --max-loaded-loras 4 --max-loras-per-batch 4 --max-lora-rank 16 --lora-target-modules q_proj v_proj"
        in joined
    )


def test_command_returns_routed_experts_for_routing_replay() -> None:
    assert "--enable-return-routed-experts" not in build_sglang_command(sglang_section(), port=1)
    section = sglang_section(return_routed_experts=True)
    assert "--enable-return-routed-experts" in build_sglang_command(section, port=1)


def test_command_options_and_extra_args() -> None:
    section = sglang_section(
        sglang_enable_memory_saver=False,
        incremental_streaming_output=False,
        host="10.0.0.5",
        sglang_args=["--context-length", "65536", "--disable-radix-cache"],
        sglang_python="/opt/venv/bin/python",
    )
    cmd = build_sglang_command(section, port=1)
    assert cmd[0] == "/opt/venv/bin/python" and cmd[-3:] == [
        "--context-length",
        "65536",
        "--disable-radix-cache",
    ]
    assert "--enable-memory-saver" not in cmd and "--incremental-streaming-output" not in cmd
    assert cmd[cmd.index("--host") + 1] == "10.0.0.5"


def test_a_cpu_server_gets_the_flags_this_device_needs() -> None:
    section = sglang_section(sglang_device="cpu", kv_cache_tokens=8192, max_batch_size=16, dtype="bfloat16")
    cmd = build_sglang_command(section, port=1)
    joined = " ".join(cmd)
    assert "--device cpu --attention-backend torch_native" in joined
    assert "--max-total-tokens 8192 --max-running-requests 16 --dtype bfloat16" in joined
    assert "--enable-memory-saver" not in cmd, "the memory saver needs CUDA"
    assert "--sleep-on-idle" in cmd, "an idle scheduler would spin a core the trainer needs"
    assert SGLangLauncher(section).env["SGLANG_USE_CPU_ENGINE"] == "1"
    gpu = build_sglang_command(sglang_section(), port=1)
    assert "--device" not in gpu and "--max-total-tokens" not in gpu and "--enable-memory-saver" in gpu
    assert "--sleep-on-idle" not in gpu


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        (EngineSection(sglang_model_path="m"), "backend must be 'sglang'"),
        (EngineSection(backend="sglang"), "sglang_model_path"),
        (sglang_section(sglang_args=["--port", "1"]), "must not set --port"),
        (sglang_section(sglang_args=["--tp-size=2"]), "must not set --tp-size"),
        (sglang_section(sglang_args=["--enable-lora"]), "must not set --enable-lora"),
        (sglang_section(sglang_args=["--max-total-tokens", "9"]), "must not set --max-total-tokens"),
    ],
)
def test_command_refuses_bad_config(section: EngineSection, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build_sglang_command(section, port=1)


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN)
    return {"PYTHONPATH": str(tmp_path)}


async def test_launcher_waits_for_health_restarts_a_dead_server_and_stops(stand_in: dict[str, str]) -> None:
    section = sglang_section(sglang_python=sys.executable)
    launcher = SGLangLauncher(section, env=stand_in, restart_backoff_s=0.05, startup_timeout_s=30)
    async with launcher, EngineClient(launcher.url, max_connect_retries=0) as client:
        assert await client.health()
        first_pid = launcher.pid
        assert first_pid is not None
        os.killpg(first_pid, signal.SIGKILL)

        async def restarted() -> bool:
            return launcher.pid != first_pid and await client.health()

        await eventually(restarted, timeout_s=60, interval_s=0.05, what="the SGLang server to restart")
        assert launcher.num_restarts == 1
    assert launcher.pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(launcher.pid, 0)


async def test_a_restarted_server_serves_the_newest_weights_and_its_owner_restores_it(
    stand_in: dict[str, str], tmp_path: Path
) -> None:
    """A restart launches `restart_weights`' model and version (not the configured ones), `up` is False
    from the death until the new server answers, and `on_restarted` runs once it does."""
    section = sglang_section(sglang_python=sys.executable, weight_version="0")
    argv = tmp_path / "argv"
    launcher = SGLangLauncher(
        section, env={**stand_in, "STAND_IN_ARGV_FILE": str(argv)}, restart_backoff_s=0.05
    )
    asked: list[str] = []
    restored: list[bool] = []

    async def newest() -> tuple[str, str]:
        asked.append("asked")
        return "/runs/r1/checkpoints/published/v7", "7"

    async def restore() -> None:
        restored.append(launcher.up)

    launcher.restart_weights = newest
    launcher.on_restarted = restore
    async with launcher:
        assert launcher.up and not asked
        os.killpg(launcher.pid or 0, signal.SIGKILL)
        await eventually(lambda: not launcher.up, timeout_s=30, interval_s=0.02, what="the death to be seen")
        await launcher.wait_up(60)
        await eventually(lambda: restored == [True], timeout_s=30, interval_s=0.02, what="on_restarted")
    first, second = argv.read_text().splitlines()
    assert "--model-path Qwen/Qwen3-8B" in first and "--weight-version 0" in first
    assert "--model-path /runs/r1/checkpoints/published/v7" in second and "--weight-version 7" in second
    assert asked == ["asked"]


async def test_wait_up_fails_once_supervision_gave_up(stand_in: dict[str, str], tmp_path: Path) -> None:
    section = sglang_section(sglang_python=sys.executable)
    launcher = SGLangLauncher(section, env=stand_in, restart_backoff_s=0.05, max_restarts=0)
    async with launcher:
        os.killpg(launcher.pid or 0, signal.SIGKILL)
        await eventually(lambda: not launcher.up, timeout_s=30, interval_s=0.02, what="the death to be seen")
        with pytest.raises(RuntimeError, match="gave up"):
            await launcher.wait_up(60)
        with pytest.raises(RuntimeError, match="after 0 restarts"):
            await launcher.wait()


async def test_a_server_whose_port_was_taken_starts_on_a_new_one(
    stand_in: dict[str, str], tmp_path: Path
) -> None:
    section = sglang_section(sglang_python=sys.executable)
    env = {**stand_in, "STAND_IN_FAIL_ONCE_FILE": str(tmp_path / "failed-once")}
    launcher = SGLangLauncher(section, env=env, startup_timeout_s=30)
    first = launcher.port
    try:
        await launcher.start()
        assert launcher.port != first and launcher.url.endswith(f":{launcher.port}")
        async with EngineClient(launcher.url) as client:
            assert await client.health()
    finally:
        await launcher.stop()


async def test_launcher_reports_a_server_that_dies_on_startup(stand_in: dict[str, str]) -> None:
    section = sglang_section(sglang_python=sys.executable)
    launcher = SGLangLauncher(section, env={**stand_in, "STAND_IN_EXIT_CODE": "3"}, startup_timeout_s=30)
    with pytest.raises(RuntimeError, match="code 3"):
        await launcher.start()
    await launcher.stop()
