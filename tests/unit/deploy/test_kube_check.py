"""The static check of the kubelet's rules (app/deploy/kube_check.py): every overlay passes, the manifests as they
were before the config became a file mount fail, and each rule finds its fault in a minimal manifest."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from app.cli import app
from app.deploy.kube_check import KubeFinding, check_manifests, variable_references
from app.deploy.kustomize import find_prerequisites
from tests.unit.deploy.support import DEPLOY, K8S, Manifest, render_kustomization

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-nested-tls-mounts.yaml"


def _pod(containers: list[dict[str, Any]], volumes: list[dict[str, Any]] | None = None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "gyre"},
        "spec": {"containers": containers, "volumes": volumes or []},
    }


def _configmap(name: str, keys: list[str]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "gyre"},
        "data": {k: "x" for k in keys},
    }


def _container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "gyre", **fields}


def _rules(findings: list[KubeFinding]) -> list[str]:
    return [f.rule for f in findings]


@pytest.mark.parametrize("kustomization", ["base", "overlays/cpu", "overlays/gpu"])
def test_every_overlay_passes(kustomization: str) -> None:
    directory = K8S / kustomization
    findings = check_manifests(render_kustomization(directory), find_prerequisites(directory))
    assert not findings, "\n".join(map(str, findings))


def test_the_manifests_before_the_fix_fail_on_the_nested_tls_mounts() -> None:
    manifests = [d for d in yaml.safe_load_all(FIXTURE.read_text()) if d]
    findings = check_manifests(manifests, find_prerequisites(K8S / "overlays" / "cpu"))
    lines = sorted(map(str, findings))
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        "Deployment/scheduler spec.template.spec.containers[scheduler].volumeMounts[tls].mountPath: "
        "/etc/gyre/tls/scheduler lies inside the configMap volume 'config' mounted at /etc/gyre"
    )
    assert lines[1].startswith(
        "StatefulSet/cell-agent spec.template.spec.containers[cell-agent].volumeMounts[tls].mountPath: "
        "/etc/gyre/tls/cell_agent lies inside the configMap volume 'config'"
    )
    assert _rules(findings) == ["nested-mount", "nested-mount"]


def test_the_prerequisites_are_the_documented_tls_secrets() -> None:
    assert find_prerequisites(K8S / "overlays" / "gpu") == ["Secret/gyre-tls-*"]
    assert "gyre-tls-<identity>" in (DEPLOY / "README.md").read_text()
    manifests = render_kustomization(K8S / "overlays" / "cpu")
    missing = check_manifests(manifests)
    assert {f.rule for f in missing} == {"reference"}
    assert len(missing) == 10, "one TLS secret per pod template (one per cell) without the prerequisites"


@pytest.mark.parametrize("volume_type", ["configMap", "secret", "projected", "downwardAPI"])
def test_nested_mount_in_each_read_only_volume_type(volume_type: str) -> None:
    source = {
        "configMap": {"name": "cm"},
        "secret": {"secretName": "s"},
        "projected": {"sources": [{"configMap": {"name": "cm"}}]},
        "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
    }[volume_type]
    pod = _pod(
        [
            _container(
                volumeMounts=[{"name": "ro", "mountPath": "/etc/x"}, {"name": "w", "mountPath": "/etc/x/y"}]
            )
        ],
        [{"name": "ro", volume_type: source}, {"name": "w", "emptyDir": {}}],
    )
    findings = check_manifests([pod, _configmap("cm", ["a"])], ["Secret/s"])
    assert [str(f).split(":")[0] for f in findings] == ["Pod/p spec.containers[c].volumeMounts[w].mountPath"]
    assert _rules(findings) == ["nested-mount"]


def test_mounts_beside_a_file_mount_or_inside_a_writable_volume_pass() -> None:
    pod = _pod(
        [
            _container(
                volumeMounts=[
                    {"name": "ro", "mountPath": "/etc/x/app.yaml", "subPath": "app.yaml"},
                    {"name": "w", "mountPath": "/etc/x/y"},
                    {"name": "w", "mountPath": "/data"},
                    {"name": "w2", "mountPath": "/data/cache"},
                ]
            )
        ],
        [
            {"name": "ro", "configMap": {"name": "cm"}},
            {"name": "w", "emptyDir": {}},
            {"name": "w2", "emptyDir": {}},
        ],
    )
    assert check_manifests([pod, _configmap("cm", ["app.yaml"])]) == []


def test_sub_path_naming_no_projected_file_or_climbing_out() -> None:
    pod = _pod(
        [
            _container(
                volumeMounts=[
                    {"name": "ro", "mountPath": "/etc/x/app.yaml", "subPath": "ap.yaml"},
                    {"name": "w", "mountPath": "/data", "subPath": "../etc"},
                ]
            )
        ],
        [{"name": "ro", "configMap": {"name": "cm"}}, {"name": "w", "emptyDir": {}}],
    )
    findings = check_manifests([pod, _configmap("cm", ["app.yaml"])])
    assert [(f.field, f.rule) for f in findings] == [
        ("spec.containers[c].volumeMounts[ro].subPath", "sub-path"),
        ("spec.containers[c].volumeMounts[w].subPath", "sub-path"),
    ]
    assert "holds no 'ap.yaml' (it holds app.yaml)" in findings[0].message


def test_references_to_objects_nobody_creates() -> None:
    pod = _pod(
        [_container(env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "api", "key": "k"}}}])],
        [
            {"name": "cm", "configMap": {"name": "absent"}},
            {"name": "opt", "configMap": {"name": "absent-but-optional", "optional": True}},
            {"name": "tls", "secret": {"secretName": "gyre-tls-x"}},
            {"name": "issued", "secret": {"secretName": "by-cert-manager"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "model"}},
        ],
    )
    certificate = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": "c", "namespace": "gyre"},
        "spec": {"secretName": "by-cert-manager"},
    }
    findings = check_manifests([pod, certificate], ["Secret/gyre-tls-*"])
    assert [(f.field, f.rule) for f in findings] == [
        ("spec.volumes[cm].configMap.name", "reference"),
        ("spec.volumes[data].persistentVolumeClaim.claimName", "reference"),
        ("spec.containers[c].env[K].valueFrom.secretKeyRef.name", "reference"),
    ]


def test_ports_that_collide_in_one_pod() -> None:
    pod = _pod(
        [
            _container(name="a", ports=[{"name": "grpc", "containerPort": 50051}]),
            _container(
                name="b",
                ports=[{"name": "grpc", "containerPort": 50051}, {"containerPort": 50051, "protocol": "UDP"}],
            ),
        ]
    )
    findings = check_manifests([pod])
    assert [(f.field, f.rule) for f in findings] == [
        ("spec.containers[b].ports[grpc].containerPort", "port-collision"),
        ("spec.containers[b].ports[grpc].name", "port-collision"),
    ]


def test_variables_the_container_does_not_define() -> None:
    container = _container(
        command=["serve", "--instance", "$(CELL_INDEX)", "--literal", "$$(NOT_A_REFERENCE)"],
        args=["$(MISSING)"],
        env=[{"name": "URL", "value": "http://$(HOST):1"}, {"name": "HOST", "value": "h"}],
    )
    findings = check_manifests([_pod([container])])
    assert [(f.field, f.rule) for f in findings] == [
        ("spec.containers[c].env[URL].value", "env-reference"),
        ("spec.containers[c].command[2]", "env-reference"),
        ("spec.containers[c].args[0]", "env-reference"),
    ]
    defined = copy.deepcopy(container)
    defined["env"] = [
        {"name": "HOST", "value": "h"},
        {"name": "CELL_INDEX", "value": "0"},
        {"name": "MISSING"},
    ]
    assert check_manifests([_pod([defined])]) == []
    assert list(variable_references("$(A) $$(B) $$$(C)")) == ["A", "C"]


def test_variables_from_an_unknown_env_source_are_not_judged() -> None:
    container = _container(command=["$(FROM_SECRET)"], envFrom=[{"secretRef": {"name": "outside"}}])
    assert _rules(check_manifests([_pod([container])], ["Secret/outside"])) == []


def test_probes_on_ports_the_container_does_not_declare() -> None:
    container = _container(
        ports=[{"name": "monitor", "containerPort": 8222}],
        startupProbe={"httpGet": {"path": "/", "port": "monitor"}},
        readinessProbe={"httpGet": {"path": "/", "port": "monitr"}},
        livenessProbe={"tcpSocket": {"port": 4222}},
    )
    findings = check_manifests([_pod([container])])
    assert [(f.field, f.rule) for f in findings] == [
        ("spec.containers[c].readinessProbe.httpGet.port", "probe-port"),
        ("spec.containers[c].livenessProbe.tcpSocket.port", "probe-port"),
    ]


def test_mounts_of_volumes_the_pod_lacks_but_claim_templates_count() -> None:
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "s", "namespace": "gyre"},
        "spec": {
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
            "template": {
                "spec": {
                    "containers": [
                        _container(
                            volumeMounts=[
                                {"name": "data", "mountPath": "/d"},
                                {"name": "typo", "mountPath": "/t"},
                            ]
                        )
                    ]
                }
            },
        },
    }
    findings = check_manifests([statefulset])
    assert [str(f).split(": ")[0] for f in findings] == [
        "StatefulSet/s spec.template.spec.containers[c].volumeMounts[typo].name"
    ]


def test_the_command_prints_one_line_per_finding_and_exits_1() -> None:
    result = CliRunner().invoke(
        app, ["deploy", "check-kube", str(FIXTURE), "--prerequisite", "Secret/gyre-tls-*"]
    )
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stdout.splitlines() if line.endswith("[nested-mount]")]
    assert len(lines) == 2
    ok = CliRunner().invoke(app, ["deploy", "check-kube", str(K8S / "overlays" / "cpu")])
    assert ok.exit_code == 0, ok.output
