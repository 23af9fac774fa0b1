"""Launching and supervising a real SGLang server for a cell (GPU nodes, or CPUs with `sglang_device: cpu`).

    async with SGLangLauncher(config.cell_agent.engine) as sglang:
        client = EngineClient(sglang.url)          # the same client as for the embedded engine

The command comes from the engine section (`backend: sglang`):

    python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size T
        --random-seed S --weight-version V [--enable-memory-saver] [--mem-fraction-static F]
        [--device cpu --attention-backend torch_native --max-total-tokens K --max-running-requests B
         --dtype D --skip-server-warmup --sleep-on-idle] [--incremental-streaming-output] [--enable-lora ...] [sglang_args...]

`--enable-memory-saver` is what lets the cell agent release and resume GPU memory on a role switch
(`/release_memory_occupation`, `/resume_memory_occupation`); it needs CUDA, so a CPU server runs without
it. On CPU (`sglang_device: cpu`) the server also gets the attention back end that runs there, an explicit
KV budget (`kv_cache_tokens`; else SGLang takes 72% of free RAM), the engine's batch size and dtype, and
`SGLANG_USE_CPU_ENGINE=1`; deploy/sglang/ installs that SGLang (`make setup`). The launcher starts the
server in its own process group, waits for `/health`, restarts it if it dies (at most `max_restarts`
times, with backoff) and stops it with SIGTERM, then SIGKILL after a grace period.

A restart is a new server, which would come back with the configured model: `restart_weights` (set by its
owner) names the weights it should serve instead (the run's newest publication), asked before each
restart, and `on_restarted` runs once the new server is healthy (its owner restores what the dead one had:
paused admission, released memory, a publication that arrived meanwhile). `up` says whether a server
answers now; `wait_up()` waits for one.

    launcher.restart_weights = newest_publication      # async () -> (model path, weight version) | None
    launcher.on_restarted = restore
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import structlog

from gyre.config.engine import EngineSection
from gyre.engine.client import EngineClient

log = structlog.get_logger(__name__)

#: Flags the launcher sets from the config; repeating them in `sglang_args` is an error.
MANAGED_FLAGS = (
    "--model-path",
    "--host",
    "--port",
    "--tp-size",
    "--tp",
    "--random-seed",
    "--weight-version",
    "--enable-memory-saver",
    "--mem-fraction-static",
    "--incremental-streaming-output",
    "--enable-lora",
    "--max-lora-rank",
    "--lora-target-modules",
    "--max-loaded-loras",
    "--max-loras-per-batch",
    "--device",
    "--attention-backend",
    "--max-total-tokens",
    "--max-running-requests",
    "--dtype",
)

#: The environment a CPU server needs (SGLang's CPU engine path).
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}

#: uvicorn's exit code when its server cannot start, typically its port taken: between `free_port` and
#: SGLang's bind, 20-200 s of startup here, another process (SGLang's own random internal ports among them)
#: can take the port. Measured once in a fresh-clone `make test`.
STARTUP_FAILURE = 3
PORT_ATTEMPTS = 3


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def build_sglang_command(section: EngineSection, *, port: int) -> list[str]:
    """The argv of `python -m sglang.launch_server` for this engine section, on `port`."""
    if section.backend != "sglang":
        raise ValueError(
            f"cell_agent.engine.backend must be 'sglang' to launch SGLang; got {section.backend!r}"
        )
    if not section.sglang_model_path:
        raise ValueError(
            "cell_agent.engine.sglang_model_path must name the model (a path or an HF id) for SGLang"
        )
    for arg in section.sglang_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise ValueError(
                f"cell_agent.engine.sglang_args must not set {flag}: it comes from its own config field "
                "(sglang_model_path, host, port, sglang_tp_size, seed, weight_version, "
                "sglang_enable_memory_saver, sglang_mem_fraction_static, incremental_streaming_output, "
                "sglang_device, kv_cache_tokens, max_batch_size, dtype)"
            )
    cmd = [
        section.sglang_python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        section.sglang_model_path,
        "--host",
        section.host,
        "--port",
        str(port),
        "--tp-size",
        str(section.sglang_tp_size),
        "--random-seed",
        str(section.seed),
        "--weight-version",
        section.weight_version,
    ]
    if section.sglang_device == "cpu":
        cmd += [
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--max-total-tokens",
            str(section.kv_cache_tokens),
            "--max-running-requests",
            str(section.max_batch_size),
            "--dtype",
            section.dtype,
            "--skip-server-warmup",  # ~10 s of a CPU start; the launcher's /health wait is the check
        ]
        if "--sleep-on-idle" not in section.sglang_args:
            cmd.append("--sleep-on-idle")  # else an idle scheduler spins a core at 100%, next to the trainer
    elif section.sglang_enable_memory_saver:
        cmd.append("--enable-memory-saver")
    if section.sglang_mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(section.sglang_mem_fraction_static)]
    if section.incremental_streaming_output:
        cmd.append("--incremental-streaming-output")
    if section.return_routed_experts:
        cmd.append("--enable-return-routed-experts")  # routing replay (gyre/model/routing.py)
    if section.enable_lora:
        # SGLang requires max_loaded_loras >= max_loras_per_batch (default 8): a batch may mix them all.
        loras = str(section.max_loaded_loras)
        cmd += ["--enable-lora", "--max-loaded-loras", loras, "--max-loras-per-batch", loras]
        if section.max_lora_rank is not None:
            cmd += ["--max-lora-rank", str(section.max_lora_rank)]
        if section.lora_target_modules:
            cmd += ["--lora-target-modules", *section.lora_target_modules]
    if "--enable-metrics" not in section.sglang_args:
        cmd.append("--enable-metrics")  # SGLang's own Prometheus /metrics on its port (deploy/ scrapes it)
    return cmd + list(section.sglang_args)


RestartWeights = Callable[[], Awaitable[tuple[str, str] | None]]
"""What a restarted server serves: (model path, weight version), or None for the configured model."""


class SGLangStartupFailed(RuntimeError):
    """The server exited before it answered `/health`."""

    def __init__(self, code: int) -> None:
        super().__init__(f"SGLang exited with code {code} during startup")
        self.code = code


class SGLangLauncher:
    """Starts, health-checks, restarts and stops one SGLang server process."""

    def __init__(
        self,
        section: EngineSection,
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 900.0,
        max_restarts: int = 3,
        restart_backoff_s: float = 5.0,
        stop_grace_s: float = 30.0,
    ) -> None:
        self.section = section
        self.port = section.port or free_port(section.host)
        self.command = build_sglang_command(section, port=self.port)
        device_env = CPU_ENV if section.sglang_device == "cpu" else {}
        self.env = {**os.environ, **device_env, **(env or {})}
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.stop_grace_s = stop_grace_s
        self.num_restarts = 0
        self.restart_weights: RestartWeights | None = None
        """Asked before each restart: the weights the new server loads (None, or None returned: the configured ones)."""
        self.on_restarted: Callable[[], Awaitable[None]] | None = None
        """Awaited once a restarted server is healthy, before supervision goes on."""
        self._up = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        return f"http://{self.section.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def up(self) -> bool:
        """A server is running and answered `/health` (False from its exit until a restart answers)."""
        return self._up.is_set() and self._process is not None and self._process.returncode is None

    async def wait_up(self, timeout_s: float) -> None:
        """Return once a server is up; raise TimeoutError after `timeout_s` (a restart takes a CPU server
        30-200 s here), RuntimeError if supervision gave up or the launcher stopped."""
        waiter = asyncio.ensure_future(self._up.wait())
        watched = [waiter] + ([self._supervisor] if self._supervisor is not None else [])
        try:
            await asyncio.wait(watched, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.up:
            return
        if self._stopping or (self._supervisor is not None and self._supervisor.done()):
            raise RuntimeError(f"SGLang at {self.url} is not supervised any more (stopped, or gave up)")
        raise TimeoutError(f"SGLang at {self.url} not back after {timeout_s} s")

    async def _spawn(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab") if self.log_path is not None else None  # noqa: SIM115 (owned by the child)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.command,
                env=self.env,
                stdout=log_file or asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.STDOUT if log_file else asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if log_file is not None:
                log_file.close()
        log.info("sglang_spawned", pid=self._process.pid, url=self.url, command=command_line(self.command))
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        assert self._process is not None
        async with EngineClient(self.url, connect_timeout_s=2.0, max_connect_retries=0) as client:
            deadline = asyncio.get_running_loop().time() + self.startup_timeout_s
            while not await client.health():
                if self._process.returncode is not None:
                    raise SGLangStartupFailed(self._process.returncode)
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"SGLang at {self.url} not healthy after {self.startup_timeout_s} s")
                await asyncio.sleep(0.5)
        self._up.set()

    async def start(self) -> SGLangLauncher:
        """Spawn and wait until healthy. A server that could not start its HTTP server (uvicorn's exit 3) on
        a port this launcher chose is started again on a new one, up to PORT_ATTEMPTS in all."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                await self._spawn()
                break
            except SGLangStartupFailed as e:
                if e.code != STARTUP_FAILURE or self.section.port or attempt == PORT_ATTEMPTS:
                    raise
                taken = self.port
                self.port = free_port(self.section.host)
                self.command = build_sglang_command(self.section, port=self.port)
                log.warning("sglang_port_retry", port_taken=taken, port=self.port, attempt=attempt)
        self._supervisor = asyncio.create_task(self._supervise(), name="sglang-supervisor")
        return self

    async def _supervise(self) -> None:
        """Restart the server when it dies; raise once it died more than `max_restarts` times."""
        while not self._stopping:
            assert self._process is not None
            code = await self._process.wait()
            self._up.clear()
            if self._stopping:
                return
            log.error("sglang_exited", code=code, restarts=self.num_restarts)
            if self.num_restarts >= self.max_restarts:
                raise RuntimeError(f"SGLang exited with code {code} after {self.num_restarts} restarts")
            self.num_restarts += 1
            await asyncio.sleep(self.restart_backoff_s * self.num_restarts)
            self.command = build_sglang_command(await self._restart_section(), port=self.port)
            await self._spawn()
            log.info("sglang_restarted", url=self.url, restarts=self.num_restarts, pid=self.pid)
            if self.on_restarted is not None:
                await self.on_restarted()

    async def _restart_section(self) -> EngineSection:
        """The engine section a restart launches: the configured one, with `restart_weights`' model path
        and weight version where it names them."""
        weights = None
        if self.restart_weights is not None:
            try:
                weights = await self.restart_weights()
            except (
                Exception
            ) as e:  # e.g. Redis unreachable this moment: on_restarted catches up after the start
                log.warning("sglang_restart_weights_unknown", error=repr(e))
        if weights is None:
            return self.section
        path, version = weights
        log.info("sglang_restart_weights", model_path=path, weight_version=version)
        return self.section.model_copy(update={"sglang_model_path": path, "weight_version": version})

    async def wait(self) -> None:
        """Return when supervision ends; raise its error if SGLang could not be kept alive."""
        assert self._supervisor is not None
        await asyncio.shield(self._supervisor)  # a waiter that is cancelled leaves supervision running

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=self.stop_grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._supervisor is not None:
            supervisor = self._supervisor
            supervisor.cancel()
            await asyncio.wait([supervisor])
            if not supervisor.cancelled():
                supervisor.exception()  # gave up: raised to whoever awaited wait(), not again here

    async def __aenter__(self) -> SGLangLauncher:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def command_line(args: Sequence[str]) -> str:
    """The command as one shell-quoted line (for logs and the README)."""
    return " ".join(shlex.quote(a) for a in args)
