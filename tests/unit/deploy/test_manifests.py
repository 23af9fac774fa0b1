"""The deployment manifests: compose validates against the compose spec, each kustomize overlay builds and
every object validates against the Kubernetes schema, every Gyre service runs with a gRPC health probe on
its configured port, nothing runs privileged or on the host network, compose publishes only on 127.0.0.1.

    PYTHONPATH=. python -m pytest -q tests/unit/deploy
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.stack.launcher import SERVICES
from gyre.config import GyreConfig, load_config
from tests.unit.deploy.support import (
    COMPOSE_FILE,
    DEPLOY,
    K8S,
    OVERLAYS,
    REPO,
    Manifest,
    find,
    grpc_port,
    objects,
    render_kustomization,
    require_module,
    workloads,
)

KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")
"""The oldest release these manifests need (gRPC probes, the pod-index label) and the newest schema known."""


def compose_check(path: Path) -> subprocess.CompletedProcess[str]:
    require_module("check_jsonschema", "install the dev extras: pip install -e '.[dev]'")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def kubernetes_validate(manifest: Manifest, version: str) -> None:
    require_module("kubernetes_validate", "install the dev extras: pip install -e '.[dev]'")
    import kubernetes_validate as kv

    kv.validate(manifest, version, strict=True)


def label(service: str) -> str:
    """Kubernetes component label of a Gyre service (names use '-', Python modules '_')."""
    return service.replace("_", "-")


# -- compose -----------------------------------------------------------------------------------------


def test_compose_file_validates_against_the_compose_spec() -> None:
    proc = compose_check(COMPOSE_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_validator_rejects_an_unknown_key(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  scheduler:\n    image: gyre:dev\n    privileged_mode: true\n")
    proc = compose_check(broken)
    assert proc.returncode != 0 and "privileged_mode" in proc.stdout


def _probe(service: str, port: int) -> list[str]:
    """app.stack.probe as `service`'s own TLS identity (the health check of compose and Kubernetes)."""
    return [
        "python",
        "-m",
        "app.stack.probe",
        "--config",
        "/etc/gyre/gyre.yaml",
        "--identity",
        service,
        str(port),
    ]


def test_compose_runs_every_service_with_a_grpc_health_check(
    compose: dict[str, Any], compose_config: GyreConfig
) -> None:
    services = compose["services"]
    expected = {s: [s] for s in SERVICES if s != "cell_agent"}
    expected["cell_agent"] = [f"cell-agent-{k}" for k in range(compose_config.scheduler.num_cells)]
    for service, names in expected.items():
        for instance, name in enumerate(names):
            assert name in services, f"compose has no {name} service"
            spec = services[name]
            command = spec["command"]
            assert command[:3] == ["python", "-m", f"services.{service}"], command
            assert command[command.index("--config") + 1] == "/etc/gyre/gyre.yaml"
            if service == "cell_agent":
                assert command[command.index("--instance") + 1] == str(instance)
            test = spec["healthcheck"]["test"]
            assert test == [
                "CMD",
                *_probe(service, grpc_port(compose_config, service)),
            ], f"{name}: the gRPC health check as its own TLS identity"
    assert not set(services) - {n for names in expected.values() for n in names} - {"nats", "redis"}


def test_compose_publishes_ports_only_on_loopback(compose: dict[str, Any]) -> None:
    published = 0
    for name, spec in compose["services"].items():
        for port in spec.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
            published += 1
    assert published > 0


SANDBOXING = {"runner", "evaluator"}
"""The pods that run the policy's code in isolated-launcher sandboxes: root, and exactly these capabilities."""
SANDBOX_CAPABILITIES = {
    "SYS_ADMIN",
    "NET_ADMIN",
    "SETUID",
    "SETGID",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "SYS_CHROOT",
}


def test_compose_containers_are_hardened(compose: dict[str, Any]) -> None:
    """Every container: read-only root, no privileges gained, all capabilities dropped; only the runner and
    the evaluator add some back, the sandboxes' (test_the_sandboxing_pods_have_what_compose_gives_those_containers)."""
    for name, spec in compose["services"].items():
        assert not spec.get("privileged", False), name
        assert spec.get("network_mode") is None and "gyre" in spec["networks"], name
        assert spec.get("read_only") is True, f"{name}: root filesystem must be read-only"
        assert spec.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in spec.get("security_opt", []), name
        if name in SANDBOXING:
            assert set(spec["cap_add"]) == SANDBOX_CAPABILITIES, name
        else:
            assert not spec.get("cap_add"), name
            assert not str(spec.get("user", "")).startswith("0"), name
        assert spec.get("pid") is None and spec.get("ipc") is None, name


def test_compose_gyre_services_wait_for_healthy_brokers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("nats", "redis"):
        assert "test" in services[name]["healthcheck"]
    for name, spec in services.items():
        if name in ("nats", "redis"):
            continue
        for broker in ("nats", "redis"):
            assert spec["depends_on"][broker]["condition"] == "service_healthy", name


def _default(source: str) -> str:
    """A bind source as compose resolves it with the variable unset (`${VAR:-default}` → default)."""
    match = re.fullmatch(r"\$\{[A-Z_]+:-(.+)\}", source)
    return match.group(1) if match else source


TLS_SOURCE = re.compile(r"\$\{GYRE_TLS_DIR:-\./tls\}/([a-z_]+(?:-[0-9]+)?)(/[a-z_]+\.[a-z]+)?")
"""A TLS identity's directory, or a file of it, written by `gyre tls init --out deploy/compose/tls` (not in
the repository): NATS mounts its `permissions.conf` beside nats.conf as well."""

TLS_IDENTITY = {
    "cell-agent-0": "cell_agent-0",
    "cell-agent-1": "cell_agent-1",
    "cell-agent-2": "cell_agent-2",
}
"""Each cell's container mounts its own cell's identity (at /etc/gyre/tls/cell_agent, where a cell agent looks)."""


def test_compose_mounts_the_deploy_configs(compose: dict[str, Any]) -> None:
    """Every bind mount names a file or directory of this repository by default, mounted read-only; the TLS
    identities' directories are the one exception (generated per deployment), each container mounting its
    own identity's only."""
    base = COMPOSE_FILE.parent
    sources = set()
    for name, spec in compose["services"].items():
        identities = []
        for volume in spec.get("volumes", []):
            if isinstance(volume, dict) and volume["type"] == "bind":
                if tls := TLS_SOURCE.fullmatch(volume["source"]):
                    assert volume.get("read_only") is True, f"{name}: {volume['target']} must be read-only"
                    if tls.group(2) is None:
                        identities.append(tls.group(1))
                    else:
                        assert tls.group(1) == TLS_IDENTITY.get(name, name.replace("-", "_")), volume
                    continue
                source = (base / _default(volume["source"])).resolve()
                assert source.exists(), f"{name} mounts missing {source}"
                assert volume.get("read_only") is True, f"{name}: {volume['target']} must be read-only"
                sources.add(source.relative_to(REPO).as_posix())
        assert identities == [TLS_IDENTITY.get(name, name.replace("-", "_"))], name
    assert sources == {
        "deploy/compose/gyre.yaml",
        "deploy/nats/nats.conf",
        "deploy/redis/redis.conf",
        "harness/demo_model/checkpoints/warmstart",
        "examples/tasks",
    }


# -- kubernetes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_validate_against_the_kubernetes_schema(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    manifests = rendered[overlay]
    assert len(manifests) > 20
    for manifest in manifests:
        assert manifest["metadata"].get("namespace") == "gyre" or manifest["kind"] == "Namespace", manifest[
            "metadata"
        ]
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate(manifest, version)


def test_kubernetes_validator_rejects_an_unknown_field(rendered: dict[str, list[Manifest]]) -> None:
    require_module("kubernetes_validate", "install the dev extras: pip install -e '.[dev]'")
    import kubernetes_validate as kv

    deployment = find(rendered["cpu"], "Deployment", "scheduler")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kv.ValidationError):
        kubernetes_validate(broken, KUBERNETES_VERSIONS[-1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_gyre_service_has_grpc_health_probes(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig, overlay: str
) -> None:
    manifests = rendered[overlay]
    for service in SERVICES:
        kind = "StatefulSet" if service == "cell_agent" else "Deployment"
        workload = find(manifests, kind, label(service))
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"][:3] == ["python", "-m", f"services.{service}"]
        port = grpc_port(k8s_config, service)
        assert {"name": "grpc", "containerPort": port} in container["ports"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            # Not Kubernetes' `grpc:` probe: it cannot show a client certificate (tls.enabled).
            assert container[probe]["exec"] == {"command": _probe(service, port)}, f"{service} {probe}"
            assert container[probe]["timeoutSeconds"] >= 5, f"{service} {probe}: python starts in ~1-2 s"
        service_object = find(manifests, "Service", label(service))
        assert service_object["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
        assert any(p["port"] == port for p in service_object["spec"]["ports"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_meet_the_restricted_pod_security_profile(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """No host network/PID/IPC, no privileged container, no hostPath or hostPort, no privilege escalation,
    RuntimeDefault seccomp, resources bounded; non-root with every capability dropped (`restricted`) but
    for the runner and the evaluator, which run as root with the sandbox's capabilities and nothing else
    (the namespace enforces `privileged` for them and warns on `restricted`: this catches any other pod
    that would not meet it before a cluster's warning does)."""
    manifests = rendered[overlay]
    labels = find(manifests, "Namespace", "gyre")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert (
        labels["pod-security.kubernetes.io/warn"]
        == labels["pod-security.kubernetes.io/audit"]
        == "restricted"
    )
    checked, sandboxing = 0, set()
    for workload in workloads(manifests):
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        component = workload["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        pod = workload["spec"]["template"]["spec"]
        for host_field in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(host_field, False), f"{name}: {host_field}"
        assert pod["automountServiceAccountToken"] is False, (
            f"{name}: no pod needs a Kubernetes API token yet"
        )
        if component in SANDBOXING:
            sandboxing.add(component)
            assert pod["securityContext"]["runAsUser"] == 0, name
            assert pod["securityContext"]["runAsNonRoot"] is False, name
        else:
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert all("hostPath" not in v for v in pod.get("volumes", [])), name
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = container["securityContext"]
            assert not ctx.get("privileged", False), name
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            if component in SANDBOXING:
                assert ctx["capabilities"]["drop"] == ["ALL"], name
                assert set(ctx["capabilities"]["add"]) == SANDBOX_CAPABILITIES, name
            else:
                assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert all("hostPort" not in p for p in container.get("ports", [])), name
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(
                resources["limits"]
            ), name
            checked += 1
    assert checked == len(SERVICES) + 2  # the six services, nats and redis
    assert sandboxing == SANDBOXING


def test_the_sandboxing_pods_have_what_compose_gives_those_containers(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig
) -> None:
    """Compose and Kubernetes run the runner and the evaluator alike: root, the same capabilities, AppArmor
    off for mounts, and the isolated launcher named in both configs."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    compose_config = load_config(COMPOSE_FILE.parent / "gyre.yaml", environ={})
    for service in sorted(SANDBOXING):
        container = compose["services"][service]
        assert container["user"].startswith("0:") and set(container["cap_add"]) == SANDBOX_CAPABILITIES
        assert "apparmor=unconfined" in container["security_opt"], service
        assert "no-new-privileges:true" in container["security_opt"], service
        workload = find(rendered["cpu"], "Deployment", service)
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations[f"container.apparmor.security.beta.kubernetes.io/{service}"] == "unconfined"
        for config in (compose_config, k8s_config):
            assert getattr(config, service).sandbox.isolation == "isolated", service


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cell_agents_are_one_pod_per_cell(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig, overlay: str
) -> None:
    statefulset = find(rendered[overlay], "StatefulSet", "cell-agent")
    assert (
        statefulset["spec"]["replicas"] == k8s_config.scheduler.num_cells == len(k8s_config.cell_agent.ports)
    )
    assert statefulset["spec"]["serviceName"] == "cell-agent"
    headless = find(rendered[overlay], "Service", "cell-agent")
    assert headless["spec"]["clusterIP"] == "None"
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[command.index("--instance") + 1] == "$(CELL_INDEX)"
    env = {e["name"]: e for e in container["env"]}
    assert (
        env["CELL_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert k8s_config.run.peer_host("cell_agent", 1) == "cell-agent-1.cell-agent"


def test_gpu_overlay_requests_gpus_and_selects_the_cluster_backends(
    rendered: dict[str, list[Manifest]],
) -> None:
    def cell_agent(overlay: str) -> Manifest:
        (container,) = find(rendered[overlay], "StatefulSet", "cell-agent")["spec"]["template"]["spec"][
            "containers"
        ]
        return container

    gpu, cpu = cell_agent("gpu"), cell_agent("cpu")
    assert int(gpu["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == gpu["resources"]["requests"]["nvidia.com/gpu"]
    env = {e["name"]: e.get("value") for e in gpu["env"]}
    assert env["GYRE_CELL_AGENT__ENGINE__BACKEND"] == "sglang"
    assert env["GYRE_CELL_AGENT__TRAINER__BACKEND"] == "megatron"
    assert env["GYRE_CELL_AGENT__TRAINER__DIST_BACKEND"] == "nccl"
    assert env["GYRE_CELL_AGENT__TRAINER__DEVICE"] == "cuda"
    assert env["GYRE_CELL_AGENT__TRAINER__PUBLICATION"] == "distributed"
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    for overlay in OVERLAYS:
        for workload in workloads(rendered[overlay]):
            if workload["metadata"]["name"] != "cell-agent":
                for container in workload["spec"]["template"]["spec"]["containers"]:
                    assert "nvidia.com/gpu" not in container["resources"]["limits"], workload["metadata"][
                        "name"
                    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_keep_brokers_and_cell_ports_inside(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    policies = {p["metadata"]["name"]: p["spec"] for p in objects(rendered[overlay], "NetworkPolicy")}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    gyre_pods = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gyre"}}}]
    by_target = {}
    for spec in policies.values():
        target = spec["podSelector"].get("matchLabels", {})
        for rule in spec.get("ingress", []):
            by_target.setdefault(tuple(sorted(target.items())), []).append(rule)
    assert by_target[(("app.kubernetes.io/name", "nats"),)] == [
        {"from": gyre_pods, "ports": [{"protocol": "TCP", "port": 4222}]}
    ]
    assert by_target[(("app.kubernetes.io/name", "redis"),)] == [
        {"from": gyre_pods, "ports": [{"protocol": "TCP", "port": 6379}]}
    ]
    cell = (("app.kubernetes.io/component", "cell-agent"), ("app.kubernetes.io/name", "gyre"))
    peers = [r for r in by_target[cell] if "ports" not in r]
    assert peers == [{"from": [{"podSelector": {"matchLabels": dict(cell)}}]}]
    for rules in by_target.values():
        for rule in rules:
            for source in rule["from"]:
                assert set(source) == {"podSelector"}, (
                    f"only pods of this namespace may be admitted; got {source}"
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_brokers_use_the_shared_configs(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    """NATS and Redis on Kubernetes run the same config files that compose mounts."""
    manifests = rendered[overlay]
    for server, path in (("nats", DEPLOY / "nats" / "nats.conf"), ("redis", DEPLOY / "redis" / "redis.conf")):
        statefulset = find(manifests, "StatefulSet", server)
        pod = statefulset["spec"]["template"]["spec"]
        (config_volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
        configmap = find(manifests, "ConfigMap", config_volume["configMap"]["name"])
        # NATS's users beside its config: deploy/nats/permissions.conf (tests/unit/deploy/test_access.py).
        extra = ("permissions.conf",) if server == "nats" else ()
        assert configmap["data"] == {p.name: p.read_text() for p in (path, *(path.parent / e for e in extra))}
        (container,) = pod["containers"]
        assert container["command"][-1] == f"/etc/{server}/{path.name}"
        assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gyre_pods_mount_the_config_they_are_told_to_read(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    manifests = rendered[overlay]
    configmap = next(
        c for c in objects(manifests, "ConfigMap") if c["metadata"]["name"].startswith("gyre-config")
    )
    assert configmap["data"] == {"gyre.yaml": (DEPLOY / "k8s" / "base" / "gyre.yaml").read_text()}
    for workload in workloads(manifests):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        if container["image"].startswith(("nats:", "redis:")):
            continue
        assert re.fullmatch(r"gyre:dev(-cuda)?", container["image"]), container["image"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        # A file mount, as compose's: the TLS secret's mount beside it must not lie inside a ConfigMap volume.
        assert mounts["/etc/gyre/gyre.yaml"]["subPath"] == "gyre.yaml"
        assert mounts["/etc/gyre/gyre.yaml"]["readOnly"] is True
        assert "/var/lib/gyre" in mounts and "/tmp" in mounts, "read-only root: home and /tmp must be volumes"


def test_broker_images_match_between_compose_and_kubernetes(
    compose: dict[str, Any], rendered: dict[str, list[Manifest]]
) -> None:
    for server in ("nats", "redis"):
        (container,) = find(rendered["cpu"], "StatefulSet", server)["spec"]["template"]["spec"]["containers"]
        assert _default(compose["services"][server]["image"]) == container["image"]


def test_broker_configs_enable_jetstream_monitoring_and_aof() -> None:
    nats = (DEPLOY / "nats" / "nats.conf").read_text()
    assert re.search(r"^jetstream\s*\{[^}]*store_dir:\s*/data/jetstream", nats, re.M | re.S)
    assert re.search(r"^http:\s*0\.0\.0\.0:8222$", nats, re.M)
    assert re.search(r"^listen:\s*0\.0\.0\.0:4222$", nats, re.M)
    redis = {
        line.split(None, 1)[0]: line.split(None, 1)[1] if " " in line else ""
        for line in (DEPLOY / "redis" / "redis.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert redis["appendonly"] == "yes" and redis["appendfsync"] == "always"
    assert redis["maxmemory-policy"] == "noeviction" and redis["dir"] == "/data"


def test_manifests_parse_as_plain_yaml() -> None:
    """Every committed manifest is YAML a plain loader reads (no tabs, no duplicate documents)."""
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(doc is not None for doc in docs), path


def test_each_cell_pod_sees_only_its_own_cells_identity(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig
) -> None:
    """The cell agents' StatefulSet projects one secret per cell (K = replicas = scheduler.num_cells), each
    under its own `cell_agent-K/`, and the container mounts only its cell's directory (`subPathExpr` on the
    pod-index's CELL_INDEX) where a cell agent looks for its identity."""
    (cells,) = [w for w in workloads(rendered["cpu"]) if w["metadata"]["name"] == "cell-agent"]
    spec = cells["spec"]["template"]["spec"]
    assert cells["spec"]["replicas"] == k8s_config.scheduler.num_cells
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    sources = tls["projected"]["sources"]
    assert [s["secret"]["name"] for s in sources] == [
        f"gyre-tls-cell-agent-{k}" for k in range(k8s_config.scheduler.num_cells)
    ]
    for k, source in enumerate(sources):
        assert {i["path"].split("/")[0] for i in source["secret"]["items"]} == {f"cell_agent-{k}"}
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert (mount["mountPath"], mount["subPathExpr"]) == (
        "/etc/gyre/tls/cell_agent",
        "cell_agent-$(CELL_INDEX)",
    )
    assert "CELL_INDEX" in {e["name"] for e in container["env"]}


def test_the_cert_manager_component_issues_every_secret_the_pods_mount(
    rendered: dict[str, list[Manifest]], k8s_config: GyreConfig, tmp_path: Path
) -> None:
    """An overlay with deploy/k8s/components/cert-manager renders a Certificate for each TLS secret a pod
    mounts, signed by the deployment's CA issuer, naming the hosts its peers dial (as `gyre tls init`)."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # relative: kustomize takes no absolute root
                "resources": [os.path.relpath(K8S / "overlays" / "cpu", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "cert-manager", tmp_path)],
            }
        )
    )
    certificates = {
        c["spec"]["secretName"]: c for c in render_kustomization(tmp_path) if c["kind"] == "Certificate"
    }
    volumes = [
        volume
        for workload in workloads(rendered["cpu"])
        for volume in workload["spec"]["template"]["spec"].get("volumes", [])
    ]
    mounted = {v["secret"]["secretName"] for v in volumes if "secret" in v} | {
        source["secret"]["name"] for v in volumes if "projected" in v for source in v["projected"]["sources"]
    }
    mounted = {secret for secret in mounted if secret.startswith("gyre-tls-")}
    assert len(mounted) == 10 and mounted <= set(certificates), mounted - set(certificates)
    for secret in mounted:
        spec = certificates[secret]["spec"]
        assert spec["issuerRef"]["name"] == "gyre-ca" and "client auth" in spec["usages"], secret
    cells = {k8s_config.run.peer_host("cell_agent", c) for c in range(k8s_config.scheduler.num_cells)}
    for cell, host in enumerate(sorted(cells)):  # each cell's own: its host, its cell
        spec = certificates[f"gyre-tls-cell-agent-{cell}"]["spec"]
        assert host in spec["dnsNames"] and not (cells - {host}) & set(spec["dnsNames"])
        assert spec["uris"] == [f"urn:gyre:cell:{cell}"]
    assert "redis" in certificates["gyre-tls-redis"]["spec"]["dnsNames"]
