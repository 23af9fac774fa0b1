"""Helpers of the deployment tests: paths, the validators, lookups in rendered manifests.

The validators are real programs (kubectl's kustomize, check-jsonschema, kubernetes-validate); a missing
one fails the test that needs it with the command that installs it, never skips it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gyre.config import GyreConfig

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_CONFIG = DEPLOY / "compose" / "gyre.yaml"
K8S = DEPLOY / "k8s"
K8S_CONFIG = K8S / "base" / "gyre.yaml"
OVERLAYS = ("cpu", "gpu")

Manifest = dict[str, Any]


def require_module(name: str, install: str) -> None:
    """Fail (not skip) when a validator's Python package is missing."""
    if importlib.util.find_spec(name) is None:
        pytest.fail(f"{name} is not installed; {install}")


def kubectl() -> str:
    """Path of kubectl (its built-in kustomize renders the overlays offline)."""
    found = shutil.which("kubectl")
    if not found:
        pytest.fail(
            "kubectl not found on PATH: the deploy tests render kustomize overlays with `kubectl kustomize`"
        )
    return found


def render_kustomization(directory: Path) -> list[Manifest]:
    """`kubectl kustomize DIR`, parsed into one dict per object."""
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def objects(manifests: list[Manifest], kind: str) -> Iterator[Manifest]:
    return (m for m in manifests if m["kind"] == kind)


def find(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    for m in objects(manifests, kind):
        if m["metadata"]["name"] == name:
            return m
    raise AssertionError(f"no {kind}/{name} in the rendered manifests")


def workloads(manifests: list[Manifest]) -> Iterator[Manifest]:
    """Every object with a pod template."""
    return (m for m in manifests if m["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"))


def grpc_port(config: GyreConfig, service: str) -> int:
    """The gRPC port a service listens on in a deploy config (cell agents: one port for every cell)."""
    if service == "cell_agent":
        ports = set(config.cell_agent.ports)
        assert len(ports) == 1, f"cell agents run one per container/pod and share one port; got {ports}"
        return ports.pop()
    return int(getattr(config, service).port)
