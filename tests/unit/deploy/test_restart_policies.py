"""Compose and Kubernetes restart what exits by their own policies (the local stack's supervisor is not
there), and clusters pull snapshots through Mooncake, which the NetworkPolicy confines."""

from __future__ import annotations

from typing import Any

from tests.unit.deploy.support import Manifest, objects

WORKLOADS = ("Deployment", "StatefulSet")


def test_every_compose_service_restarts_on_exit(compose: dict[str, Any]) -> None:
    policies = {name: service.get("restart") for name, service in compose["services"].items()}
    assert policies and all(p in ("always", "unless-stopped", "on-failure") for p in policies.values()), (
        policies
    )


def test_every_kubernetes_workload_declares_restart_policy_always(
    rendered: dict[str, list[Manifest]],
) -> None:
    for overlay, manifests in rendered.items():
        workloads = [m for kind in WORKLOADS for m in objects(manifests, kind)]
        assert len(workloads) >= 8, overlay  # six services (cell agents in one StatefulSet) + nats + redis
        for w in workloads:
            assert w["spec"]["template"]["spec"].get("restartPolicy") == "Always", (
                overlay,
                w["metadata"]["name"],
            )


def test_clusters_select_mooncake_and_the_gpu_overlay_says_so(
    rendered: dict[str, list[Manifest]], k8s_config: Any
) -> None:
    assert k8s_config.cell_agent.trainer.weight_transport == "mooncake"
    (cells,) = [m for m in objects(rendered["gpu"], "StatefulSet") if m["metadata"]["name"] == "cell-agent"]
    (container,) = cells["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("GYRE_CELL_AGENT__TRAINER__WEIGHT_TRANSPORT") == "mooncake"
