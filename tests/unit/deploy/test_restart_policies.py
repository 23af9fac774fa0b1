"""Compose and Kubernetes restart what exits by their own policies (the local stack's supervisor is not
there); on CPU the cells' collectives and snapshot pulls go over the TLS star, and the GPU overlay pulls
snapshots through Mooncake and reduces over NCCL, which the NetworkPolicy confines."""

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


def test_cpu_cells_use_the_tls_star_and_the_gpu_overlay_mooncake_and_nccl(
    rendered: dict[str, list[Manifest]], k8s_config: Any, compose_config: Any
) -> None:
    for config in (k8s_config, compose_config):
        trainer = config.cell_agent.trainer
        assert (trainer.dist_backend, trainer.weight_transport) == ("tls", "torch") and config.tls.enabled
    (cells,) = [m for m in objects(rendered["gpu"], "StatefulSet") if m["metadata"]["name"] == "cell-agent"]
    (container,) = cells["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("GYRE_CELL_AGENT__TRAINER__WEIGHT_TRANSPORT") == "mooncake"
    assert env.get("GYRE_CELL_AGENT__TRAINER__DIST_BACKEND") == "nccl"
