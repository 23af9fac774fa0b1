"""The deploy configs (compose and Kubernetes) are valid, resolved and agree with the manifests: every
peer host is a real compose service or Kubernetes Service, and the overlays' GYRE_* variables are real
config paths that take effect. Also `run.peer_host`, the lookup the services dial with.

    PYTHONPATH=. python -m pytest -q tests/unit/deploy/test_deploy_config.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from app.stack.launcher import SERVICES
from gyre.config import ConfigError, GyreConfig, RunSection, load_config
from gyre.model.arch import ModelError
from gyre.model.model_dir import ModelDir
from gyre.trainer.backends import trainer_class
from gyre.trainer.layout import check_trainer
from services.cell_agent.engine_hosts import ENGINE_HOSTS
from tests.support.models import hf_dir
from tests.unit.deploy.support import COMPOSE_CONFIG, K8S_CONFIG, OVERLAYS, Manifest, find, objects


@pytest.mark.parametrize("config_path", [COMPOSE_CONFIG, K8S_CONFIG], ids=["compose", "k8s"])
def test_deploy_config_is_resolved(config_path: Path) -> None:
    """Nothing is left for start-up to pick: fixed ports, server URLs, a host for every peer."""
    config = load_config(config_path, environ={})
    assert config.nats.url and config.redis.url
    for service in SERVICES:
        if service == "cell_agent":
            assert len(config.cell_agent.ports) == config.scheduler.num_cells
            assert len(config.cell_agent.engine_ports) == config.scheduler.num_cells
            assert all(config.cell_agent.ports) and all(config.cell_agent.engine_ports)
        else:
            assert getattr(config, service).port > 0, service
        assert service in config.run.peer_hosts, service
    assert config.proxy.http_port > 0
    assert config.run.host == "0.0.0.0"
    assert str(config.run.dir).startswith("/var/lib/gyre/")


def test_compose_peer_hosts_are_compose_services(compose: dict[str, Any], compose_config: GyreConfig) -> None:
    names = set(compose["services"])
    run = compose_config.run
    for service in SERVICES:
        cells = range(compose_config.scheduler.num_cells) if service == "cell_agent" else [None]
        for cell in cells:
            assert run.peer_host(service, cell) in names, (service, cell)
    for url, port in ((compose_config.nats.url, 4222), (compose_config.redis.url, 6379)):
        parsed = urlparse(url)
        assert parsed.hostname in names and parsed.port == port


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_k8s_peer_hosts_are_services(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig, overlay: str
) -> None:
    manifests = rendered[overlay]
    services = {s["metadata"]["name"]: s for s in objects(manifests, "Service")}
    run = k8s_config.run
    for service in SERVICES:
        if service == "cell_agent":
            statefulset = find(manifests, "StatefulSet", "cell-agent")
            for cell in range(k8s_config.scheduler.num_cells):
                pod, governing = run.peer_host(service, cell).split(".")
                assert pod == f"{statefulset['metadata']['name']}-{cell}"
                assert governing == statefulset["spec"]["serviceName"] and governing in services
        else:
            assert run.peer_host(service) in services, service
    for url, port in ((k8s_config.nats.url, 4222), (k8s_config.redis.url, 6379)):
        parsed = urlparse(url)
        assert parsed.hostname in services
        assert any(p["port"] == port for p in services[str(parsed.hostname)]["spec"]["ports"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_environment_is_a_valid_config_override(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """The GYRE_* variables of every Gyre container name real fields and the result validates."""
    for kind in ("Deployment", "StatefulSet"):
        for workload in objects(rendered[overlay], kind):
            for container in workload["spec"]["template"]["spec"]["containers"]:
                environ = {
                    e["name"]: e["value"] for e in container.get("env", []) if e["name"].startswith("GYRE_")
                }
                config = load_config(K8S_CONFIG, environ=environ)
                if workload["metadata"]["name"] == "cell-agent":
                    expected = {
                        "cpu": ("embedded", "torch", "tls", "cpu"),
                        "gpu": ("sglang", "megatron", "nccl", "cuda"),
                    }[overlay]
                    agent = config.cell_agent
                    trainer = agent.trainer
                    assert (
                        agent.engine.backend,
                        trainer.backend,
                        trainer.dist_backend,
                        trainer.device,
                    ) == expected


def _cell_agent_config(rendered: dict[str, list[Manifest]], overlay: str, model_dir: Path) -> GyreConfig:
    """The cell agents' config of an overlay, with `model.path` set as a deployment must set it."""
    (container,) = find(rendered[overlay], "StatefulSet", "cell-agent")["spec"]["template"]["spec"][
        "containers"
    ]
    environ = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("GYRE_")}
    return load_config(K8S_CONFIG, environ={**environ, "GYRE_MODEL__PATH": str(model_dir)})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cell_agents_of_every_overlay_pass_their_start_checks(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """What a cell agent checks before it connects to anything (gyre.trainer.layout.check_trainer, the
    model directory, the registries of trainer backends and engine hosts) passes for the overlay's
    settings on a Qwen3 model: the configuration can start. (Running it needs the overlay's hardware.)"""
    model_dir = hf_dir("qwen3")
    config = _cell_agent_config(rendered, overlay, model_dir)
    check_trainer(config.cell_agent.trainer, ModelDir.open(config.model).path)
    backend = trainer_class(config.cell_agent.trainer.backend)
    assert backend.name == config.cell_agent.trainer.backend
    assert config.cell_agent.engine.backend in ENGINE_HOSTS
    if overlay == "gpu":
        trainer = config.cell_agent.trainer
        assert trainer.megatron.params_dtype == "bfloat16" and trainer.publication == "distributed"
        # the same checks refuse a layout that cannot start, before anything is spawned
        bad = load_config(
            K8S_CONFIG,
            environ={
                "GYRE_MODEL__PATH": str(model_dir),
                "GYRE_CELL_AGENT__TRAINER__BACKEND": "megatron",
                "GYRE_CELL_AGENT__TRAINER__MEGATRON__TENSOR_PARALLEL_SIZE": "4",
            },
        )
        with pytest.raises(ModelError, match="num_key_value_heads: 2 is not divisible"):
            check_trainer(bad.cell_agent.trainer, model_dir)
        with pytest.raises(ConfigError, match="dist_backend nccl needs a CUDA trainer device"):
            load_config(K8S_CONFIG, environ={"GYRE_CELL_AGENT__TRAINER__DIST_BACKEND": "nccl"})


def test_peer_host_falls_back_to_the_bind_host() -> None:
    assert RunSection().peer_host("scheduler") == "127.0.0.1"
    assert RunSection(host="10.1.2.3").peer_host("proxy") == "10.1.2.3"
    assert RunSection(host="0.0.0.0").peer_host("packer") == "127.0.0.1"
    run = RunSection(
        host="0.0.0.0", peer_hosts={"cell_agent": "cell-agent-{cell}.cell-agent", "proxy": "proxy"}
    )
    assert run.peer_host("cell_agent", 7) == "cell-agent-7.cell-agent"
    assert run.peer_host("proxy") == "proxy"
    assert run.peer_host("runner") == "127.0.0.1"


def test_peer_host_rejects_what_it_cannot_resolve() -> None:
    run = RunSection(peer_hosts={"cell_agent": "cell-agent-{cell}"})
    with pytest.raises(ValueError, match="pass cell="):
        run.peer_host("cell_agent")
    with pytest.raises(ValueError, match="unknown service"):
        run.peer_host("sandbox")


@pytest.mark.parametrize(
    ("peer_hosts", "hint"),
    [
        ("{sandbox: sandbox}", "unknown service 'sandbox'"),
        ("{scheduler: 'scheduler-{cell}'}", "only cell_agent may use {cell}"),
    ],
)
def test_bad_peer_hosts_name_the_field(tmp_path: Path, peer_hosts: str, hint: str) -> None:
    path = tmp_path / "gyre.yaml"
    path.write_text(f"run:\n  peer_hosts: {peer_hosts}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "run.peer_hosts" in str(info.value) and hint in str(info.value)
