"""Kubernetes in step with compose: every service gets the same Gyre settings from both (the config file
plus the container's GYRE_* variables), runs the same command and mounts the model where compose does;
the GPU overlay's engines serve on every GPU the pod requests; nothing grants Kubernetes API permissions
that no code uses. (tests/integration/test_compose_cluster.py runs the compose side for real.)

    PYTHONPATH=. python -m pytest -q tests/unit/deploy/test_compose_k8s_parity.py
"""

from __future__ import annotations

from typing import Any

import pytest

from gyre.config import load_config
from tests.unit.deploy.support import COMPOSE_CONFIG, K8S_CONFIG, Manifest, find, objects

SERVICES = ("scheduler", "proxy", "runner", "evaluator", "packer")
DIFFERENT_BY_DESIGN = {("run", "id"), ("run", "peer_hosts")}
"""The run's name and the DNS form of peer hosts (compose service names vs Kubernetes Services)."""


def _gyre_env(env: Any) -> dict[str, str]:
    if isinstance(env, list):
        pairs = [e.split("=", 1) if isinstance(e, str) else (e["name"], e.get("value", "")) for e in env]
        return {k: v for k, v in pairs if k.startswith("GYRE_")}
    return {k: str(v) for k, v in (env or {}).items() if k.startswith("GYRE_")}


def _settings(path: Any, environ: dict[str, str]) -> dict[str, Any]:
    dump = load_config(path, environ=environ).model_dump(mode="json")
    for section, field in DIFFERENT_BY_DESIGN:
        dump[section].pop(field)
    return dump


def _compose_service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    service = compose["services"][name]
    return service if isinstance(service, dict) else {}


def _k8s_container(manifests: list[Manifest], service: str) -> dict[str, Any]:
    kind, name = ("StatefulSet", "cell-agent") if service == "cell_agent" else ("Deployment", service)
    (container,) = find(manifests, kind, name)["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _mounts_model(volumes: list[Any]) -> bool:
    for v in volumes:
        target = v.get("target") if isinstance(v, dict) else str(v).split(":")[1] if ":" in str(v) else ""
        mount = v.get("mountPath") if isinstance(v, dict) else None
        if "/models/policy" in (target, mount):
            return True
    return False


@pytest.mark.parametrize("service", [*SERVICES, "cell_agent"])
def test_every_service_gets_the_same_settings_from_compose_and_kubernetes(
    compose: dict[str, Any], rendered: dict[str, list[Manifest]], service: str
) -> None:
    compose_names = [f"cell-agent-{k}" for k in range(3)] if service == "cell_agent" else [service]
    container = _k8s_container(rendered["cpu"], service)
    k8s = _settings(K8S_CONFIG, _gyre_env(container.get("env")))
    for name in compose_names:
        entry = _compose_service(compose, name)
        assert _settings(COMPOSE_CONFIG, _gyre_env(entry.get("environment"))) == k8s, name
        # the same program with the same config path (cell agents: the index comes from the pod's name)
        assert entry["command"][:5] == container["command"][:5], name
        assert _mounts_model(entry.get("volumes", [])) == _mounts_model(container.get("volumeMounts", [])), (
            f"{name}: the model is mounted in compose exactly where Kubernetes mounts it"
        )
    uses_model = service in ("proxy", "cell_agent")
    assert _mounts_model(container.get("volumeMounts", [])) == uses_model, service


def test_gpu_overlay_serves_on_every_gpu_it_requests(rendered: dict[str, list[Manifest]]) -> None:
    container = _k8s_container(rendered["gpu"], "cell_agent")
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert int(container["resources"]["requests"]["nvidia.com/gpu"]) == gpus
    config = load_config(K8S_CONFIG, environ=_gyre_env(container["env"]))
    assert config.cell_agent.engine.backend == "sglang"
    assert config.cell_agent.engine.sglang_tp_size == gpus, "SGLang's tensor-parallel size is the pod's GPUs"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_no_kubernetes_api_permissions_without_code_that_uses_them(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """The runner runs executions as its own subprocesses (no pod launcher exists), so no Role or binding
    grants anything to any ServiceAccount, and no pod mounts a token."""
    manifests = rendered[overlay]
    for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert not list(objects(manifests, kind)), kind
    for kind in ("Deployment", "StatefulSet"):
        for workload in objects(manifests, kind):
            assert workload["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
