"""Rendered Kubernetes manifests made playable by `podman kube play` 4.3, one documented gap at a time.

    playable = convert(objects, work_dir, prefix="gyre-kube-1a2b", secrets={"gyre-tls-nats": tls / "nats"},
                       claims={"model": model_dir})
    playable.pods["scheduler"]       # a Pod manifest; playable.volumes: the named volumes to create first

Each conversion below replaces what podman 4.3 lacks with what the kubelet would have done itself, so the
processes see what they would see in a pod of a cluster; nothing else is rewritten (not the commands, the
images, the config files, the certificates, the users or the probes' commands). deploy/README.md lists the
same conversions ("Kubernetes without a cluster").
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Manifest = dict[str, Any]

CONVERSIONS: dict[str, str] = {
    "controllers-to-pods": "podman 4.3 plays Pods and Deployments but skips StatefulSets: each workload "
    "becomes the Pods its controller would create (a StatefulSet's `<name>-K` with the `apps.kubernetes.io/"
    "pod-index` and `statefulset.kubernetes.io/pod-name` labels, hostname and subdomain, its claims "
    "`<template>-<name>-K`)",
    "pods-named-as-dns": "podman's DNS answers pod names only: each Pod is named by the name its peers dial "
    "(a headless Service's name where one pod backs it, else `<pod>.<service>`)",
    "subpath-files": "podman 4.3 ignores `subPath`: a ConfigMap/Secret file mounted by subPath becomes a "
    "hostPath file holding that key, as the kubelet bind-mounts it",
    "secret-dirs": "podman 4.3 writes a Secret volume's data as base64 text and finds no Kubernetes Secret: a "
    "Secret volume (or a projected volume of Secrets, from its `subPathExpr` down) becomes a hostPath "
    "directory of its files, root-owned, group fsGroup, mode defaultMode, as the kubelet writes them",
    "volumes-per-pod": "podman 4.3 turns an emptyDir into a named volume called after the pod's volume name, "
    "shared by every pod using that name, copies the image's directory into a claim's volume and ignores "
    "fsGroup: each emptyDir and claim becomes a host directory of its own, group fsGroup with the setgid "
    "bit, as the kubelet prepares a volume (an emptyDir of medium Memory: a tmpfs volume of its size); a "
    "claim bound to existing storage (the model) becomes a hostPath of it",
    "ports-unpublished": "podman 4.3 publishes every containerPort on the host's 0.0.0.0: the ports are "
    "dropped (they only name ports; processes listen on what their config says) after named probe ports "
    "were replaced by their numbers",
    "command-variables": "podman 4.3 passes `$(VAR)` in command and args unexpanded: they are expanded from "
    "the container's env (fieldRef values from the pod's own metadata) as the kubelet does",
}
"""Each conversion: the podman 4.3 gap and what replaces it (deploy/README.md says the same)."""

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(slots=True)
class PlayablePods:
    pods: dict[str, Manifest] = field(default_factory=dict)
    """Pod name → Pod manifest, in the order they were rendered."""
    sources: dict[str, str] = field(default_factory=dict)
    """Pod name → `Kind/name` of the workload it came from."""
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Named tmpfs volume (an emptyDir of medium Memory) → {"tmpfs_bytes": size}, created before playing."""
    directories: dict[str, Path] = field(default_factory=dict)
    empty_dirs: dict[str, list[str]] = field(default_factory=dict)
    """Pod name → its emptyDirs (volume or directory names): a recreated pod gets them empty again."""
    """Every other emptyDir and claim: its host directory, group fsGroup (setgid), made by `convert`."""
    applied: dict[str, list[str]] = field(default_factory=dict)
    """Conversion name → the objects it changed."""

    def note(self, conversion: str, what: str) -> None:
        assert conversion in CONVERSIONS, conversion
        seen = self.applied.setdefault(conversion, [])
        if what not in seen:
            seen.append(what)


def _bytes(quantity: str | None) -> int | None:
    if not quantity:
        return None
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if str(quantity).endswith(suffix):
            return int(float(str(quantity)[: -len(suffix)]) * factor)
    return int(quantity)


def _service_for(manifests: list[Manifest], labels: dict[str, str]) -> str | None:
    for m in manifests:
        selector = (m.get("spec") or {}).get("selector") or {}
        if m["kind"] == "Service" and selector and all(labels.get(k) == v for k, v in selector.items()):
            return str(m["metadata"]["name"])
    return None


def _pods_of(manifests: list[Manifest], workload: Manifest, out: PlayablePods) -> list[tuple[str, Manifest]]:
    """(pod name, Pod) for each pod the workload's controller would run."""
    kind, name = workload["kind"], workload["metadata"]["name"]
    template = workload["spec"]["template"]
    labels = dict(template["metadata"].get("labels") or {})
    service = _service_for(manifests, labels)
    replicas = int(workload["spec"].get("replicas", 1))
    pods = []
    for ordinal in range(replicas):
        meta = copy.deepcopy(template["metadata"])
        spec = copy.deepcopy(template["spec"])
        if kind == "StatefulSet":
            pod_name = f"{name}-{ordinal}"
            meta["labels"] = {
                **labels,
                "apps.kubernetes.io/pod-index": str(ordinal),
                "statefulset.kubernetes.io/pod-name": pod_name,
            }
            spec["hostname"], spec["subdomain"] = pod_name, workload["spec"].get("serviceName", name)
            for claim in workload["spec"].get("volumeClaimTemplates") or []:
                claim_name = f"{claim['metadata']['name']}-{pod_name}"
                spec["volumes"] = [
                    *(spec.get("volumes") or []),
                    {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}},
                ]
            out.note("controllers-to-pods", f"{kind}/{name}")
            dns = service if replicas == 1 and service else f"{pod_name}.{spec['subdomain']}"
        else:
            pod_name = name
            assert replicas == 1, f"{kind}/{name}: one replica expected, got {replicas}"
            dns = service or name
        if dns != (pod_name if kind == "StatefulSet" else name):
            out.note("pods-named-as-dns", f"{kind}/{name} → {dns}")
        meta["name"] = dns
        meta.pop("annotations", None)
        meta["namespace"] = workload["metadata"].get("namespace", "default")
        pods.append((dns, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}))
    return pods


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text.replace("$$(", "\0")).replace("\0", "$(")


def _env_values(container: Manifest, pod: Manifest) -> dict[str, str]:
    values: dict[str, str] = {}
    for env in container.get("env") or []:
        if "value" in env:
            values[env["name"]] = _expand(str(env["value"]), values)
            continue
        path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        match = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        if match:
            values[env["name"]] = str(pod["metadata"].get("labels", {}).get(match.group(1), ""))
        elif path in ("metadata.name", "metadata.namespace"):
            values[env["name"]] = str(pod["metadata"][path.split(".")[1]])
    return values


def _write(path: Path, data: bytes, mode: int, gid: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chown(path, 0, gid if gid is not None else 0)
    path.chmod(mode)


def _config_files(manifests: list[Manifest], namespace: str, name: str) -> dict[str, bytes]:
    for m in manifests:
        meta = m["metadata"]
        if (
            m["kind"] == "ConfigMap"
            and meta["name"] == name
            and meta.get("namespace", "default") == namespace
        ):
            return {k: str(v).encode() for k, v in (m.get("data") or {}).items()}
    raise ValueError(f"ConfigMap {namespace}/{name} is not in the manifests")


def _secret_files(secrets: dict[str, Path], name: str) -> dict[str, bytes]:
    if name not in secrets:
        raise ValueError(f"Secret {name}: give its files (kubectl create secret generic --from-file=DIR)")
    return {p.name: p.read_bytes() for p in sorted(secrets[name].iterdir()) if p.is_file()}


def _projected_files(secrets: dict[str, Path], projected: Manifest) -> dict[str, bytes]:
    """A projected volume of Secrets: each source's keys (or its `items`, at their paths)."""
    files: dict[str, bytes] = {}
    for source in projected.get("sources") or []:
        if set(source) != {"secret"}:
            raise ValueError(f"a projected volume source this bench does not play: {sorted(source)}")
        data = _secret_files(secrets, source["secret"]["name"])
        items = source["secret"].get("items")
        files |= {i["path"]: data[i["key"]] for i in items} if items else data
    return files


def _convert_volumes(
    pod_name: str,
    pod: Manifest,
    manifests: list[Manifest],
    work_dir: Path,
    prefix: str,
    secrets: dict[str, Path],
    claims: dict[str, Path],
    out: PlayablePods,
) -> None:
    spec, namespace = pod["spec"], pod["metadata"]["namespace"]
    gid = (spec.get("securityContext") or {}).get("fsGroup")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    files: dict[str, dict[str, bytes]] = {}
    for name, v in volumes.items():
        if "configMap" in v:
            files[name] = _config_files(manifests, namespace, v["configMap"]["name"])
        elif "secret" in v:
            files[name] = _secret_files(secrets, v["secret"]["secretName"])
        elif "projected" in v:
            files[name] = _projected_files(secrets, v["projected"])
    new_volumes: dict[str, Manifest] = {}
    for container in spec["containers"]:
        env = _env_values(container, pod)
        for mount in container.get("volumeMounts") or []:
            v, sub_path = volumes[mount["name"]], mount.pop("subPath", None)
            sub_path_expr = mount.pop("subPathExpr", None)
            if sub_path is not None and mount["name"] in files:
                volume_name = f"{mount['name']}-{sub_path.replace('.', '-').replace('/', '-')}"
                host = work_dir / "files" / pod_name / mount["name"] / sub_path
                mode = int((v.get("configMap") or v.get("secret") or {}).get("defaultMode", 0o644))
                _write(host, files[mount["name"]][sub_path], mode, gid)
                new_volumes[volume_name] = {
                    "name": volume_name,
                    "hostPath": {"path": str(host), "type": "File"},
                }
                mount["name"] = volume_name
                out.note("subpath-files", f"Pod/{pod_name}")
            elif "secret" in v or "projected" in v:  # projected: Secrets only (what the manifests project)
                # the directory of its files, or of those under `subPathExpr` (a cell's own identity)
                under = _expand(str(sub_path_expr), env).rstrip("/") + "/" if sub_path_expr else ""
                host = work_dir / "secrets" / pod_name / (mount["name"] + (f"-{under[:-1]}" if under else ""))
                mode = int((v.get("secret") or v["projected"]).get("defaultMode", 0o644))
                chosen = {
                    k[len(under) :]: data for k, data in files[mount["name"]].items() if k.startswith(under)
                }
                if not chosen:
                    raise ValueError(f"Pod/{pod_name}: {mount['name']} holds nothing under {under!r}")
                for key, data in chosen.items():
                    _write(host / key, data, mode, gid)
                new_volumes[host.name] = {
                    "name": host.name,
                    "hostPath": {"path": str(host), "type": "Directory"},
                }
                mount["name"] = host.name
                out.note("secret-dirs", f"Pod/{pod_name}")
            elif "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] in claims:
                host = claims[v["persistentVolumeClaim"]["claimName"]]
                new_volumes[mount["name"]] = {
                    "name": mount["name"],
                    "hostPath": {"path": str(host), "type": "Directory"},
                }
                out.note("volumes-per-pod", f"Pod/{pod_name}")
            elif "persistentVolumeClaim" in v or "emptyDir" in v:
                claim = v.get("persistentVolumeClaim", {}).get("claimName")
                named = f"{prefix}-{claim}" if claim else f"{prefix}-{pod_name.split('.')[0]}-{mount['name']}"
                if (v.get("emptyDir") or {}).get("medium") == "Memory":
                    out.volumes[named] = {"tmpfs_bytes": _bytes(v["emptyDir"].get("sizeLimit")) or 2**30}
                    source = {"persistentVolumeClaim": {"claimName": named}}
                else:
                    host = work_dir / "volumes" / named
                    if named not in out.directories:
                        host.mkdir(parents=True)
                        os.chown(host, 0, gid if gid is not None else 0)
                        host.chmod(0o2775 if gid is not None else 0o755)
                        out.directories[named] = host
                    source = {"hostPath": {"path": str(host), "type": "Directory"}}
                new_volumes[mount["name"]] = {"name": mount["name"], **source}
                if not claim and named not in out.empty_dirs.setdefault(pod_name, []):
                    out.empty_dirs[pod_name].append(named)
                out.note("volumes-per-pod", f"Pod/{pod_name}")
            else:
                raise ValueError(
                    f"Pod/{pod_name}: volume {mount['name']} has a type this bench does not play"
                )
    spec["volumes"] = list(new_volumes.values())


def _convert_container(pod_name: str, pod: Manifest, container: Manifest, out: PlayablePods) -> None:
    ports = {str(p["name"]): int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name")}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        for handler in (container.get(probe) or {}).values():
            if isinstance(handler, dict) and isinstance(handler.get("port"), str):
                handler["port"] = ports[handler["port"]]
    if container.pop("ports", None):
        out.note("ports-unpublished", f"Pod/{pod_name}")
    env = _env_values(container, pod)
    for part in ("command", "args"):
        if part in container:
            expanded = [_expand(str(arg), env) for arg in container[part]]
            if expanded != container[part]:
                out.note("command-variables", f"Pod/{pod_name}")
            container[part] = expanded


def convert(
    manifests: list[Manifest],
    work_dir: Path,
    prefix: str,
    secrets: dict[str, Path],
    claims: dict[str, Path],
) -> PlayablePods:
    """The pods of `manifests` as `podman kube play` 4.3 can play them (module docstring). `secrets`: each
    Secret's files (a directory, as `kubectl create secret generic --from-file`); `claims`: the claims bound
    to existing storage (a host directory); every other claim and emptyDir is a named volume `prefix-…`."""
    out = PlayablePods()
    for workload in manifests:
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for pod_name, pod in _pods_of(manifests, workload, out):
            _convert_volumes(pod_name, pod, manifests, work_dir, prefix, secrets, claims, out)
            for container in pod["spec"]["containers"]:
                _convert_container(pod_name, pod, container, out)
            out.pods[pod_name] = pod
            out.sources[pod_name] = f"{workload['kind']}/{workload['metadata']['name']}"
    return out
