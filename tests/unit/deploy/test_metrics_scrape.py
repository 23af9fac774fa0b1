"""Compose and Kubernetes scrape every service's `/metrics`, and the Grafana dashboard reads only series the
services define (validated offline: the compose spec, the rendered overlays, the dashboard's expressions)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.stack.launcher import SERVICES
from gyre.config import GyreConfig
from gyre.metrics.registry import SERVICES as SERIES_SERVICES
from tests.unit.deploy.support import DEPLOY, Manifest, find, objects, workloads
from tests.unit.deploy.test_manifests import compose_check

PROMETHEUS = DEPLOY / "prometheus"
MONITORING = DEPLOY / "compose" / "monitoring.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gyre.json"
K8S_COMPONENTS = {"scheduler", "proxy", "runner", "evaluator", "packer", "cell-agent"}


def _targets(job: dict[str, Any]) -> set[str]:
    return {t for sc in job["static_configs"] for t in sc["targets"]}


def test_deploy_configs_serve_metrics_on_one_fixed_port(
    compose_config: GyreConfig, k8s_config: GyreConfig
) -> None:
    for config in (compose_config, k8s_config):
        assert config.metrics.serve and config.metrics.port == 9400


def test_compose_prometheus_scrapes_every_service_and_engine(
    compose: dict[str, Any], compose_config: GyreConfig
) -> None:
    jobs = {
        j["job_name"]: j
        for j in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    }
    cells = [f"cell-agent-{k}" for k in range(compose_config.scheduler.num_cells)]
    services = [s for s in SERVICES if s != "cell_agent"] + cells
    assert set(services) <= set(compose["services"])
    assert _targets(jobs["gyre"]) == {f"{s}:{compose_config.metrics.port}" for s in services}
    (engine_port,) = set(compose_config.cell_agent.engine_ports)
    assert _targets(jobs["gyre-engines"]) == {f"{c}:{engine_port}" for c in cells}
    # the engines' job keeps SGLang's own series only: the embedded engine's are on the cell agent's port
    assert jobs["gyre-engines"]["metric_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "sglang:.*", "action": "keep"}
    ]


def test_compose_monitoring_validates_and_runs_hardened_on_loopback() -> None:
    proc = compose_check(MONITORING)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = yaml.safe_load(MONITORING.read_text())
    assert set(spec["services"]) == {"prometheus", "grafana"}
    for name, service in spec["services"].items():
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"] and service["networks"] == ["gyre"], name
        assert all(str(p).startswith("127.0.0.1:") for p in service["ports"]), name
        assert service["restart"] == "unless-stopped", name
        for volume in service["volumes"]:
            if isinstance(volume, dict):
                assert (MONITORING.parent / volume["source"]).resolve().is_file(), volume
                assert volume["read_only"] is True, volume
    provisioned = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "gyre.yml").read_text()
    )
    mounted = {v["target"] for v in spec["services"]["grafana"]["volumes"] if isinstance(v, dict)}
    assert f"{provisioned['providers'][0]['options']['path']}/gyre.json" in mounted


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_every_gyre_pod_is_annotated_for_scraping(
    rendered: dict[str, list[Manifest]], overlay: str, k8s_config: GyreConfig
) -> None:
    port = k8s_config.metrics.port
    seen = set()
    for workload in workloads(rendered[overlay]):
        template = workload["spec"]["template"]
        component = template["metadata"]["labels"].get("app.kubernetes.io/component")
        if template["metadata"]["labels"].get("app.kubernetes.io/name") != "gyre":
            continue
        seen.add(component)
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", component
        assert (
            annotations.get("prometheus.io/port") == str(port)
            and annotations.get("prometheus.io/path") == "/metrics"
        )
        (container,) = template["spec"]["containers"]
        assert {"name": "metrics", "containerPort": port} in container["ports"], component
        if component == "cell-agent":
            (engine_port,) = set(k8s_config.cell_agent.engine_ports)
            assert annotations["gyre.dev/engine-metrics-port"] == str(engine_port)
    assert seen == K8S_COMPONENTS
    policy = find(rendered[overlay], "NetworkPolicy", "metrics-from-prometheus")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "gyre"}}
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert {p["port"] for p in rule["ports"]} == {port, *k8s_config.cell_agent.engine_ports}
    assert not any(
        o["metadata"]["name"] == "metrics-from-prometheus" and o["kind"] != "NetworkPolicy"
        for o in objects(rendered[overlay], "NetworkPolicy")
    )


def test_kubernetes_prometheus_config_reads_the_manifests_annotations() -> None:
    jobs = {
        j["job_name"]: j
        for j in yaml.safe_load((PROMETHEUS / "kubernetes.yml").read_text())["scrape_configs"]
    }
    assert set(jobs) == {"gyre", "gyre-engines"}
    sources = {
        label for j in jobs.values() for rule in j["relabel_configs"] for label in rule["source_labels"]
    }
    # Prometheus exposes annotation `a.b/c-d` as __meta_kubernetes_pod_annotation_a_b_c_d
    for annotation in (
        "prometheus.io/scrape",
        "prometheus.io/port",
        "prometheus.io/path",
        "gyre.dev/engine-metrics-port",
    ):
        assert "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9]", "_", annotation) in sources, (
            annotation
        )
    for job in jobs.values():
        (sd,) = job["kubernetes_sd_configs"]
        assert sd == {"role": "pod", "namespaces": {"names": ["gyre"]}}


def _defined_series() -> set[str]:
    """Every `gyre_*` sample name the services' metrics define (each built on a fresh registry, the
    scheduler's over a fresh policy; the embedded engine's from its table), with Prometheus's suffixes."""
    from prometheus_client import CollectorRegistry

    from gyre.config.scheduler import SchedulerSection
    from services.cell_agent.engine.metrics import KV_SERIES, SERIES
    from services.cell_agent.metrics import CellAgentMetrics
    from services.evaluator.metrics import EvaluatorMetrics
    from services.packer.metrics import PackerMetrics
    from services.proxy.metrics import ProxyMetrics
    from services.runner.metrics import RunnerMetrics
    from services.scheduler.metrics import SchedulerMetrics
    from services.scheduler.params import policy_params
    from services.scheduler.policy import Policy

    registries = [CollectorRegistry() for _ in range(5)]
    policy = Policy(policy_params(SchedulerSection()))
    SchedulerMetrics(registries[0], snapshot=policy.snapshot, driver=lambda: None)
    PackerMetrics(registries[1])
    CellAgentMetrics(registries[2], cell=0)
    RunnerMetrics(registries[3])
    EvaluatorMetrics(registries[4], pending=lambda: 0)
    suffixes = {"counter": ("_total",), "histogram": ("", "_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {
        f.name + sfx
        for r in [*registries, ProxyMetrics().registry]
        for f in r.collect()
        for sfx in suffixes.get(f.type, ("",))
    }
    return names | {f"gyre_engine_{what}" for what, *_ in (*SERIES, *KV_SERIES)}


def test_the_dashboard_reads_only_series_the_services_define() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    defined = _defined_series()
    assert "gyre_scheduler_waterlevel_executions" in defined and "gyre_engine_kv_usage_ratio" in defined
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\b(gyre_[a-z0-9_]+|sglang:[a-z_]+)", e)}
    unknown = {n for n in used if n.startswith("gyre_") and n not in defined}
    assert not unknown, f"the dashboard reads series no service defines: {sorted(unknown)}"
    services_shown = {
        n.split("_")[1] if not n.startswith("gyre_cell_agent") else "cell_agent"
        for n in used
        if n.startswith("gyre_")
    }
    assert services_shown == set(SERIES_SERVICES), (
        f"services without a panel: {set(SERIES_SERVICES) - services_shown}"
    )
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_dashboard_file_is_the_one_grafana_and_readme_name() -> None:
    assert (
        DASHBOARD.is_file()
        and Path(DEPLOY / "README.md").read_text().count("grafana/dashboards/gyre.json") >= 1
    )
