"""`gyre bench kube`'s conversion of the rendered cpu overlay for `podman kube play` (bench/_kube_convert.py):
each documented conversion applies, and nothing else of the pods changes — not the commands beyond their
`$(VAR)`s, the images, the env, the users, the probes' commands or the files' contents."""

from __future__ import annotations

import copy
import stat
from pathlib import Path

import pytest

from bench._kube_convert import CONVERSIONS, PlayablePods, convert
from tests.unit.deploy.support import DEPLOY, Manifest, find

CELLS = tuple(f"cell_agent-{k}" for k in range(3))
"""Each cell's own identity (`gyre tls init`), a secret each."""
IDENTITIES = ("scheduler", "proxy", "runner", "evaluator", "packer", "nats", "redis", *CELLS)
UNCHANGED = ("image", "env", "securityContext", "resources", "name")


@pytest.fixture
def converted(
    rendered: dict[str, list[Manifest]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Manifest], PlayablePods, Path]:
    owners: dict[str, int] = {}
    monkeypatch.setattr("bench._kube_convert.os.chown", lambda p, uid, gid: owners.__setitem__(str(p), gid))
    tls = tmp_path / "tls"
    for identity in IDENTITIES:
        (tls / identity).mkdir(parents=True)
        for name in ("ca.crt", "tls.crt", "tls.key", "redis.json"):
            (tls / identity / name).write_text(f"{identity} {name}")
    manifests = copy.deepcopy(rendered["cpu"])
    secrets = {f"gyre-tls-{i.replace('_', '-')}": tls / i for i in IDENTITIES}
    playable = convert(manifests, tmp_path / "work", "gk", secrets, {"model": tmp_path})
    return manifests, playable, tmp_path / "work"


def test_every_pod_is_named_as_its_peers_dial_it(
    converted: tuple[list[Manifest], PlayablePods, Path],
) -> None:
    _, playable, _ = converted
    cells = [f"cell-agent-{k}.cell-agent" for k in range(3)]
    assert set(playable.pods) == {
        "scheduler",
        "proxy",
        "runner",
        "evaluator",
        "packer",
        "nats",
        "redis",
        *cells,
    }
    for k, name in enumerate(cells):
        pod = playable.pods[name]
        assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == str(k)
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"cell-agent-{k}", "cell-agent")
        (container,) = pod["spec"]["containers"]
        assert container["command"][-2:] == ["--instance", str(k)], "$(CELL_INDEX) expanded"
        claims = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert claims["data"]["hostPath"]["path"].endswith(f"gk-data-cell-agent-{k}")


def test_nothing_but_the_conversions_changes(converted: tuple[list[Manifest], PlayablePods, Path]) -> None:
    manifests, playable, _ = converted
    assert set(playable.applied) == set(CONVERSIONS)
    for pod_name, pod in playable.pods.items():
        kind, name = playable.sources[pod_name].split("/")
        (before,) = find(manifests, kind, name)["spec"]["template"]["spec"]["containers"]
        (after,) = pod["spec"]["containers"]
        assert {k: after.get(k) for k in UNCHANGED} == {k: before.get(k) for k in UNCHANGED}
        assert "ports" not in after
        if "$(" not in " ".join(before["command"]):
            assert after["command"] == before["command"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "exec" in before.get(probe, {}):
                assert after[probe] == before[probe]
        assert not any("subPath" in m for m in after["volumeMounts"])
        assert [m["mountPath"] for m in after["volumeMounts"]] == [
            m["mountPath"] for m in before["volumeMounts"]
        ]


def test_files_hold_what_the_kubelet_would_mount(
    converted: tuple[list[Manifest], PlayablePods, Path],
) -> None:
    _, playable, _ = converted
    volumes = {v["name"]: v for v in playable.pods["nats"]["spec"]["volumes"]}
    config = Path(volumes["config-nats-conf"]["hostPath"]["path"])
    assert config.read_text() == (DEPLOY / "nats" / "nats.conf").read_text()
    key = Path(volumes["tls"]["hostPath"]["path"]) / "tls.key"
    assert key.read_text() == "nats tls.key" and stat.S_IMODE(key.stat().st_mode) == 0o440
    for k in range(3):  # a cell's container sees its own cell's identity only, where a cell agent looks
        pod = playable.pods[f"cell-agent-{k}.cell-agent"]
        (mount,) = [
            m
            for m in pod["spec"]["containers"][0]["volumeMounts"]
            if m["mountPath"].startswith("/etc/gyre/tls")
        ]
        assert mount["mountPath"] == "/etc/gyre/tls/cell_agent", mount
        directory = Path({v["name"]: v for v in pod["spec"]["volumes"]}[mount["name"]]["hostPath"]["path"])
        assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "redis.json", "tls.crt", "tls.key"]
        assert (directory / "tls.key").read_text() == f"cell_agent-{k} tls.key"
    mounts = {m["mountPath"]: m for m in playable.pods["scheduler"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/etc/gyre/gyre.yaml"]["readOnly"] is True
    homes = [
        v["hostPath"]["path"]
        for pod in playable.pods.values()
        for v in pod["spec"]["volumes"]
        if v["name"] in ("home", "tmp") and not v["hostPath"]["path"].endswith("-workspaces")
    ]
    assert len(homes) >= 10 and len(set(homes)) == len(homes), "each pod's emptyDirs are its own"
    assert playable.volumes["gk-cell-agent-0-shm"] == {"tmpfs_bytes": 2**30}
    # A pod played again (a deleted pod recreated) gets its emptyDirs empty; its claims stay.
    assert playable.empty_dirs["cell-agent-0.cell-agent"] == ["gk-cell-agent-0-tmp", "gk-cell-agent-0-shm"]
    assert playable.empty_dirs["scheduler"] == ["gk-scheduler-home", "gk-scheduler-tmp"]


def test_the_conversions_are_the_ones_deploy_readme_lists() -> None:
    readme = (DEPLOY / "README.md").read_text()
    missing = [name for name in CONVERSIONS if f"| {name} |" not in readme]
    assert not missing, missing
