"""The pods of `gyre bench kube` in podman: a network of their own, their volumes, `podman kube play` of one
pod at a time (so one can be deleted and played again, as Kubernetes recreates a deleted pod), the host's
port-forwards to them, their logs, and removing all of it.

    play = KubePlay("gyre-kube-1a2b", work_dir, log_dir)
    play.create(playable)                     # network + volumes + every pod
    with play.forward("scheduler", 50051) as port: ...     # 127.0.0.1:port → the pod, as kubectl port-forward
    play.delete("cell-agent-2.cell-agent"); play.play("cell-agent-2.cell-agent")
    play.remove_all(); play.left_running()    # [] once everything is gone

Everything is named `<prefix>…` and labelled `gyre.bench=kube-<prefix>` where podman takes labels.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from bench._images import podman_env
from bench._kube_convert import PlayablePods


class KubePlay:
    def __init__(self, prefix: str, work_dir: Path, log_dir: Path) -> None:
        self.prefix = prefix
        self.network = prefix
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.env = podman_env()
        self.playable = PlayablePods()

    def podman(self, *args: str, check: bool = True, timeout_s: float = 300) -> str:
        done = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])}: {done.stderr.strip()[-2000:]}")
        return done.stdout

    # -- creating --------------------------------------------------------------------------------
    def create(self, playable: PlayablePods) -> None:
        self.playable = playable
        self.podman("network", "create", "--label", f"gyre.bench=kube-{self.prefix}", self.network)
        for name in playable.volumes:
            self._create_tmpfs(name)
        for pod in playable.pods:
            self.play(pod)

    def _create_tmpfs(self, name: str) -> None:
        # podman 4.3 takes `o=size=` for a quota option; tmpfs's own block count it passes on.
        blocks = int(self.playable.volumes[name]["tmpfs_bytes"]) // 4096
        argv = ["volume", "create", "--label", f"gyre.bench=kube-{self.prefix}", "--opt", "type=tmpfs"]
        self.podman(*argv, "--opt", "device=tmpfs", "--opt", f"o=nr_blocks={blocks}", name)

    def pod_file(self, pod: str) -> Path:
        path = self.work_dir / "pods" / f"{pod}.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(self.playable.pods[pod], sort_keys=False))
        return path

    def play(self, pod: str) -> None:
        self.podman("kube", "play", "--network", self.network, str(self.pod_file(pod)))

    def delete(self, pod: str, grace_s: int = 30) -> None:
        """What `kubectl delete pod` does: SIGTERM, the grace period, SIGKILL, gone; the pod's claims stay,
        its emptyDirs do not (the pod played again gets them empty, as a new pod of its StatefulSet would)."""
        self.save_logs(pod, suffix=f"-{int(time.time())}")
        self.podman("pod", "rm", "-f", "-t", str(grace_s), pod)
        for name in self.playable.empty_dirs.get(pod, []):  # the pod played again gets fresh emptyDirs
            if name in self.playable.volumes:
                self.podman("volume", "rm", "-f", name)
                self._create_tmpfs(name)
            else:
                directory = self.playable.directories[name]
                for entry in list(directory.iterdir()):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()

    # -- reading ---------------------------------------------------------------------------------
    def containers(self, pod: str) -> list[str]:
        spec = self.playable.pods[pod]["spec"]
        return [f"{pod}-{c['name']}" for c in spec["containers"]]

    def ip(self, pod: str) -> str:
        fmt = f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}'
        return self.podman("inspect", "--format", fmt, self.containers(pod)[0]).strip()

    def state(self, pod: str) -> str:
        out = self.podman("inspect", "--format", "{{.State.Status}}", self.containers(pod)[0], check=False)
        return out.strip() or "absent"

    def healthy(self, pod: str) -> bool:
        """The pod's readiness probe passes now, run as the kubelet runs it: an exec probe inside the
        container, an httpGet or tcpSocket one against the pod's address. (podman makes the liveness probe a
        healthcheck but, without systemd, never runs it; `podman healthcheck run` would count failures
        towards a restart that a startup probe would have held off on a cluster.)"""
        container = self.playable.pods[pod]["spec"]["containers"][0]
        probe = container.get("readinessProbe") or {}
        timeout_s = float(probe.get("timeoutSeconds", 1))
        try:
            if "exec" in probe:
                argv = ["podman", "exec", self.containers(pod)[0], *probe["exec"]["command"]]
                done = subprocess.run(argv, env=self.env, capture_output=True, timeout=timeout_s + 30)
                return done.returncode == 0
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"http://{self.ip(pod)}:{get['port']}{get.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=timeout_s) as reply:
                    return 200 <= reply.status < 400
            if "tcpSocket" in probe:
                socket.create_connection((self.ip(pod), int(probe["tcpSocket"]["port"])), timeout_s).close()
            return True
        except (OSError, subprocess.TimeoutExpired):
            return False

    def wait_healthy(self, pods: list[str], timeout_s: float, t0: float | None = None) -> dict[str, float]:
        """Seconds from `t0` until each pod's probe passed; a TimeoutError names those that never did."""
        t0 = time.monotonic() if t0 is None else t0
        deadline, ready = time.monotonic() + timeout_s, {}
        while len(ready) < len(pods) and time.monotonic() < deadline:
            for pod in pods:
                if pod not in ready and self.state(pod) == "running" and self.healthy(pod):
                    ready[pod] = round(time.monotonic() - t0, 1)
            time.sleep(0.5)
        missing = [p for p in pods if p not in ready]
        if missing:
            raise TimeoutError(f"not healthy after {timeout_s:.0f} s: {', '.join(missing)}")
        return ready

    def volume_path(self, name: str) -> Path:
        """The host directory of an emptyDir or claim named `name` (bench/_kube_convert.py)."""
        return self.playable.directories[name]

    def save_logs(self, pod: str, suffix: str = "") -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for container in self.containers(pod):
            done = subprocess.run(["podman", "logs", container], env=self.env, capture_output=True, text=True)
            (self.log_dir / f"{pod.split('.')[0]}{suffix}.log").write_text(done.stdout + done.stderr)

    @contextlib.contextmanager
    def forward(self, pod: str, port: int) -> Iterator[int]:
        """A loopback port whose connections reach `pod`'s `port` (as `kubectl port-forward` gives one): the
        host dials 127.0.0.1, which the deployment's certificates name, and nothing listens beyond it."""
        server = socket.create_server(("127.0.0.1", 0))
        target = (self.ip(pod), port)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        def accept() -> None:
            while True:
                try:
                    client, _ = server.accept()
                except OSError:
                    return
                try:
                    upstream = socket.create_connection(target, timeout=10)
                    upstream.settimeout(None)
                except OSError:
                    client.close()
                    continue
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

        threading.Thread(target=accept, name=f"forward-{pod}-{port}", daemon=True).start()
        try:
            yield int(server.getsockname()[1])
        finally:
            server.close()

    # -- removing --------------------------------------------------------------------------------
    def remove_all(self) -> None:
        present = [pod for pod in self.playable.pods if self.state(pod) != "absent"]
        for pod in present:
            self.save_logs(pod)
        if present:  # one call: podman stops the pods in parallel
            self.podman("pod", "rm", "-f", "-t", "10", *present, check=False)
        for name in self.playable.volumes:
            self.podman("volume", "rm", "-f", name, check=False)
        self.podman("network", "rm", "-f", self.network, check=False)
        for directory in ("volumes", "secrets"):  # the pods' data (gathered by the audit) and key copies
            shutil.rmtree(self.work_dir / directory, ignore_errors=True)

    def left_running(self) -> list[str]:
        """Whatever of this bench's is still in podman: pods, containers, volumes, the network."""
        left: list[str] = []
        pods = set(self.podman("pod", "ps", "--format", "{{.Name}}", check=False).split())
        left += [f"pod {p}" for p in self.playable.pods if p in pods]
        volumes = set(self.podman("volume", "ls", "--format", "{{.Name}}", check=False).split())
        left += [f"volume {v}" for v in self.playable.volumes if v in volumes]
        left += [f"directory {d}" for d in self.playable.directories.values() if d.exists()]
        networks = set(self.podman("network", "ls", "--format", "{{.Name}}", check=False).split())
        left += [f"network {self.network}"] if self.network in networks else []
        return left

    def describe(self) -> dict[str, Any]:
        return {pod: {"from": self.playable.sources[pod], "ip": self.ip(pod)} for pod in self.playable.pods}
