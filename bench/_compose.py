"""deploy/compose/compose.yaml run by a real compose implementation (podman-compose) under a project name of
its own, and the node-level operations `gyre bench cluster` performs on its containers.

    project = ComposeProject("gyre-bench-1a2b", env={"GYRE_IMAGE": ..., ...})
    project.up()                               # podman-compose -p NAME -f deploy/compose/compose.yaml up -d
    project.wait_healthy(timeout_s=300)        # runs the compose file's own healthchecks (podman runs them
                                               # only under systemd, which these machines do not have)
    project.kill("cell-agent-2")               # SIGKILL the container's process, as a node crash would: the
                                               # restart policy brings it back (`podman kill` would not)
    project.partition("cell-agent-2", 10.0)    # off the network for 10 s, back at the same address
    project.down()                             # containers, volumes and the network: what this project made

Podman's state is shared with other users of the machine: everything here is addressed by the project's
name (podman-compose labels what it creates with it), and `down` removes only that.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._images import podman_env
from gyre.paths import REPO_ROOT

COMPOSE_FILE = REPO_ROOT / "deploy" / "compose" / "compose.yaml"
PROJECT_LABEL = "io.podman.compose.project"


def podman_compose() -> str:
    """podman-compose of this environment (the dev extras install it), else the one on PATH."""
    local = Path(sys.executable).parent / "podman-compose"
    found = str(local) if local.exists() else shutil.which("podman-compose")
    if found is None:
        raise FileNotFoundError("podman-compose not found: pip install podman-compose (make setup does)")
    return found


@dataclass(frozen=True, slots=True)
class Container:
    service: str
    name: str
    state: str
    """podman's status: running, exited, ..."""
    exit_code: int
    pid: int
    ip: str
    restarts: int
    health: str


class ComposeProject:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = {**podman_env(), **env}
        self.log_dir = log_dir
        self.network = f"{name}_gyre"

    # -- compose ---------------------------------------------------------------------------------
    def compose(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [podman_compose(), "-p", self.name, "-f", str(COMPOSE_FILE), *args]
        with open(self.log_dir / "compose.log", "a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            return subprocess.run(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=timeout_s
            )

    def up(self, *services: str, no_deps: bool = False) -> None:
        """`up -d` of every service, or of `services` (without the ones they depend on: `no_deps`)."""
        done = self.compose("up", "-d", "--no-build", *(["--no-deps"] if no_deps else []), *services)
        if done.returncode != 0:
            raise RuntimeError(f"podman-compose up failed ({self.log_dir / 'compose.log'})")

    def down(self) -> list[str]:
        """Remove the project's containers, volumes and network; returns whatever of it is left (nothing)."""
        self.compose("down", "-v", "-t", "5")
        for kind in ("container", "volume", "network"):  # anything compose left behind, by label only
            for _ in range(3):  # a container others depend on goes only after them
                ids = self._podman(kind, "ls", "-q", "--filter", f"label={PROJECT_LABEL}={self.name}")
                if not ids:
                    break
                argv = (
                    ["podman", "rm", "-f", "-t", "0"] if kind == "container" else ["podman", kind, "rm", "-f"]
                )
                subprocess.run([*argv, *ids], env=self.env, capture_output=True)
        return self.leftovers()

    def leftovers(self) -> list[str]:
        left: list[str] = []
        for kind in ("container", "volume", "network"):
            left += [
                f"{kind} {i}"
                for i in self._podman(kind, "ls", "-q", "--filter", f"label={PROJECT_LABEL}={self.name}")
            ]
        return left

    def _podman(self, kind: str, *args: str) -> list[str]:
        argv = ["podman", kind, *args] if kind != "container" else ["podman", "ps", "-a", *args[1:]]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout
        return [line for line in out.split() if line]

    # -- containers ------------------------------------------------------------------------------
    def containers(self) -> dict[str, Container]:
        """The project's containers by compose service name."""
        ids = self._podman("container", "ls", "-q", "--filter", f"label={PROJECT_LABEL}={self.name}")
        if not ids:
            return {}
        raw = subprocess.run(["podman", "inspect", *ids], env=self.env, capture_output=True, text=True).stdout
        out: dict[str, Container] = {}
        for c in json.loads(raw or "[]"):
            service = c["Config"]["Labels"].get("com.docker.compose.service", c["Name"])
            nets = c.get("NetworkSettings", {}).get("Networks") or {}
            ip = next((n.get("IPAddress", "") for n in nets.values()), "")
            state = c["State"]
            out[service] = Container(
                service=service,
                name=c["Name"],
                state=state["Status"],
                exit_code=int(state.get("ExitCode", 0)),
                pid=int(state.get("Pid", 0)),
                ip=ip,
                restarts=int(c.get("RestartCount", 0)),
                health=(state.get("Health") or {}).get("Status", ""),
            )
        return out

    def healthcheck(self, service: str) -> bool:
        """Run the compose file's healthcheck of `service` once (exit 0 = healthy)."""
        name = self.containers()[service].name
        try:
            done = subprocess.run(
                ["podman", "healthcheck", "run", name], env=self.env, capture_output=True, timeout=60
            )
        except subprocess.TimeoutExpired:
            return False  # a container too busy to answer within a minute is not healthy yet
        return done.returncode == 0

    def wait_healthy(
        self, services: list[str], timeout_s: float, stop_on_exit: bool = True
    ) -> dict[str, float]:
        """Seconds until each service's healthcheck passed; raises with the unhealthy ones after `timeout_s`."""
        t0 = time.monotonic()
        ready: dict[str, float] = {}
        while time.monotonic() - t0 < timeout_s:
            found = self.containers()
            for s in services:
                if s in ready or s not in found:
                    continue
                if found[s].state == "running" and self.healthcheck(s):
                    ready[s] = round(time.monotonic() - t0, 1)
            if len(ready) == len(services):
                return ready
            time.sleep(1.0)
        missing = sorted(set(services) - set(ready))
        raise TimeoutError(f"not healthy after {timeout_s:.0f} s: {', '.join(missing)}")

    def logs(self, service: str, tail: int | None = None) -> str:
        name = self.containers()[service].name
        argv = ["podman", "logs", *(["--tail", str(tail)] if tail else []), name]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        return done.stdout + done.stderr

    def save_logs(self) -> None:
        for service in self.containers():
            (self.log_dir / f"{service}.log").write_text(self.logs(service))

    def watch_exits(self) -> ExitWatch:
        """Record every exit of the project's containers from now on (podman's `died` events)."""
        return ExitWatch(self)

    # -- node-level faults -------------------------------------------------------------------------
    def kill(self, service: str) -> Container:
        """SIGKILL the container's process from the host (a crash: the restart policy applies)."""
        before = self.containers()[service]
        if before.pid <= 0:
            raise RuntimeError(f"{service} is not running ({before.state})")
        subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(before.pid)], check=True)
        return before

    def restart(self, service: str) -> None:
        """`podman restart`: the service's process stops (SIGTERM) and starts again, its volume kept."""
        name = self.containers()[service].name
        subprocess.run(["podman", "restart", "-t", "10", name], env=self.env, check=True, capture_output=True)

    def partition(self, service: str, seconds: float) -> None:
        """Disconnect `service` from the project's network for `seconds`, then reconnect it at the same
        address (a cut cable, not a new host)."""
        c = self.containers()[service]
        subprocess.run(
            ["podman", "network", "disconnect", self.network, c.name],
            env=self.env,
            check=True,
            capture_output=True,
        )
        try:
            time.sleep(seconds)
        finally:
            subprocess.run(
                ["podman", "network", "connect", "--ip", c.ip, "--alias", service, self.network, c.name],
                env=self.env,
                check=True,
                capture_output=True,
            )

    def network_info(self) -> dict[str, Any] | None:
        """`podman network inspect` of the project's network (its bridge interface, subnets and gateways),
        None while it does not exist."""
        done = subprocess.run(
            ["podman", "network", "inspect", self.network], env=self.env, capture_output=True, text=True
        )
        if done.returncode != 0:
            return None
        found = json.loads(done.stdout or "[]")
        return dict(found[0]) if found else None

    def inspect(self, service: str) -> dict[str, Any]:
        name = self.containers()[service].name
        raw = subprocess.run(["podman", "inspect", name], env=self.env, capture_output=True, text=True).stdout
        return dict(json.loads(raw)[0])


class ExitWatch:
    """The exit codes of a project's containers as they die, from `podman events` (a container that its
    restart policy brings straight back is exited for a moment only: polling its state misses that)."""

    def __init__(self, project: ComposeProject) -> None:
        argv = ["podman", "events", "--filter", "event=died", "--format", "json"]
        argv += ["--filter", f"label={PROJECT_LABEL}={project.name}"]
        self._proc = subprocess.Popen(
            argv, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._codes: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="podman-events", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            service = (event.get("Attributes") or {}).get("com.docker.compose.service", event.get("Name"))
            with self._lock:
                self._codes.setdefault(str(service), []).append(int(event.get("ContainerExitCode", -1)))

    def exits(self) -> dict[str, list[int]]:
        """Exit codes so far by service, oldest first."""
        with self._lock:
            return {s: list(codes) for s, codes in self._codes.items()}

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
