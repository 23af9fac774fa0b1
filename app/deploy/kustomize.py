"""Rendered Kubernetes manifests: a kustomization through `kubectl kustomize` (offline), or a file of them,
and the prerequisites its `prerequisites.yaml` names. `gyre deploy check-kube` and `gyre bench kube` read
the overlays through here.

    objects = load_manifests(Path("deploy/k8s/overlays/cpu"))    # one dict per object
    patterns = find_prerequisites(Path("deploy/k8s/overlays/cpu"))  # ["Secret/gyre-tls-*"]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

PREREQUISITES_FILE = "prerequisites.yaml"


def render_kustomization(directory: Path, timeout_s: float = 120) -> str:
    """`kubectl kustomize DIRECTORY`'s output; ValueError naming the fix where kubectl is missing or fails."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ValueError(
            "kubectl not found on PATH (its built-in kustomize renders the overlay): apt install kubectl"
        )
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise ValueError(f"kubectl kustomize {directory} failed: {proc.stderr.strip()}")
    return proc.stdout


def load_manifests(source: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization directory (rendered), of a YAML file, or of standard input (`-`)."""
    if str(source) == "-":
        text = sys.stdin.read()
    elif source.is_dir():
        text = render_kustomization(source)
    else:
        text = source.read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find_prerequisites(source: Path) -> list[str]:
    """The `Kind/name` patterns of the `prerequisites.yaml` nearest at or above `source` (none: [])."""
    start = source.resolve()
    for directory in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = directory / PREREQUISITES_FILE
        if candidate.is_file():
            data = yaml.safe_load(candidate.read_text()) or {}
            return [str(p) for p in data.get("prerequisites") or []]
    return []
