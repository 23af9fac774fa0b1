"""A static check of rendered Kubernetes manifests for what stops a pod on a real cluster, one line per finding.

Schema validation (kubernetes-validate) accepts manifests whose pods never start: a volume mounted inside a
ConfigMap volume passes every schema, and the runtime then fails `mkdir …: read-only file system`. This
module models the kubelet's rules behind such failures, without an API server:

- `nested-mount`: a mount inside a ConfigMap, Secret, projected or downwardAPI volume (the kubelet mounts
  those read-only, so the runtime cannot create the inner mountpoint);
- `sub-path`: a `subPath` that is absolute or climbs out (`..`), or that names no file the projected volume
  holds (the container gets an empty directory where it expected the file);
- `reference`: a ConfigMap, Secret, PersistentVolumeClaim or ServiceAccount a pod uses that the manifests
  do not create (a cert-manager Certificate creates its `secretName`) and no prerequisite names;
- `port-collision`: two containers of a pod on one port and protocol, or one port name twice;
- `env-reference`: a `$(VAR)` in `command`, `args`, an env value or `subPathExpr` naming a variable the
  container does not define (before it, for env values): Kubernetes leaves the text as it is;
- `probe-port`: a probe on a port (name or number) the container does not declare;
- `mount-volume`: a mount naming no volume of the pod (nor a StatefulSet's claim template).

    findings = check_manifests(objects, prerequisites=["Secret/gyre-tls-*"])
    print("\\n".join(map(str, findings)))       # e.g. StatefulSet/cell-agent spec.template…mountPath: …

From the command line, over a kustomization (rendered with `kubectl kustomize`) or a file of manifests:

    gyre deploy check-kube deploy/k8s/overlays/cpu

Prerequisites are `Kind/name` patterns (fnmatch); the command reads them from the `prerequisites.yaml`
nearest above the overlay (deploy/k8s/prerequisites.yaml: the TLS secrets of deploy/README.md).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from app.deploy.kube_objects import (
    Manifest,
    ObjectKey,
    created_objects,
    env_from_names,
    object_key,
    projected_files,
    references,
)

READ_ONLY_VOLUME_TYPES = ("configMap", "secret", "projected", "downwardAPI")
"""Volume types the kubelet always mounts read-only (whatever the mount's `readOnly` says)."""

POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
"""Where each workload kind keeps its pod spec."""

_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass(frozen=True, slots=True)
class KubeFinding:
    """One way a pod of the manifests would fail: the object, the field and why."""

    object: str
    """`Kind/name`, e.g. `StatefulSet/cell-agent`."""
    field: str
    """The field's path, list items by name: `spec.template.spec.containers[cell-agent].volumeMounts[tls]…`."""
    rule: str
    """The rule broken (the module docstring lists them)."""
    message: str

    def __str__(self) -> str:
        return f"{self.object} {self.field}: {self.message} [{self.rule}]"


def _volume_type(volume: Manifest) -> str:
    return next((t for t in volume if t != "name"), "emptyDir")


def variable_references(text: str) -> Iterator[str]:
    """The variables `$(NAME)` in `text` refers to, as Kubernetes expands them (`$$(NAME)` is an escape)."""
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        match = re.match(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", text[i:])
        if match:
            yield match.group(1)
            i += match.end()
        else:
            i += 1


Problem = tuple[str, str, str]
"""(field, rule, message) of one finding, the field relative to the object."""


def _check_mounts(
    container: Manifest,
    at: str,
    volumes: dict[str, Manifest],
    claim_templates: set[str],
    files_of: dict[str, set[str] | None],
) -> Iterator[Problem]:
    mounts = container.get("volumeMounts") or []
    read_only_dirs = []
    for mount in mounts:
        field = f"{at}.volumeMounts[{mount['name']}]"
        volume = volumes.get(mount["name"])
        if volume is None and mount["name"] not in claim_templates:
            yield f"{field}.name", "mount-volume", f"the pod has no volume {mount['name']!r}"
            continue
        kind = _volume_type(volume) if volume is not None else "persistentVolumeClaim"
        sub_path = str(mount.get("subPath") or "")
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            yield f"{field}.subPath", "sub-path", f"{sub_path!r} must be a relative path inside the volume"
        elif sub_path and kind in READ_ONLY_VOLUME_TYPES:
            files = files_of.get(mount["name"])
            if (
                files is not None
                and sub_path not in files
                and not any(f.startswith(sub_path + "/") for f in files)
            ):
                yield (
                    f"{field}.subPath",
                    "sub-path",
                    f"the {kind} volume {mount['name']!r} holds no {sub_path!r} (it holds "
                    f"{', '.join(sorted(files)) or 'nothing'}): the container gets an empty directory "
                    f"at {mount['mountPath']} instead of the file",
                )
        if kind in READ_ONLY_VOLUME_TYPES and not sub_path:
            read_only_dirs.append((mount, kind))
    seen: dict[str, str] = {}
    for mount in mounts:
        path = posixpath.normpath(str(mount["mountPath"]))
        field = f"{at}.volumeMounts[{mount['name']}].mountPath"
        if path in seen:
            yield field, "nested-mount", f"{path} is also the mountPath of volume {seen[path]!r}"
        seen.setdefault(path, mount["name"])
        for outer, kind in read_only_dirs:
            outer_path = posixpath.normpath(str(outer["mountPath"]))
            if outer is not mount and path.startswith(outer_path.rstrip("/") + "/"):
                yield (
                    field,
                    "nested-mount",
                    f"{path} lies inside the {kind} volume {outer['name']!r} mounted at {outer_path}, which "
                    "the kubelet mounts read-only: the runtime cannot create the mountpoint (mkdir: read-only "
                    "file system) and the container never starts",
                )


def _check_env(container: Manifest, at: str, env_from: set[str] | None) -> Iterator[Problem]:
    defined: set[str] = set()
    for env in container.get("env") or []:
        for name in variable_references(str(env.get("value", ""))):
            if name not in defined and (env_from is None or name not in env_from):
                yield (
                    f"{at}.env[{env['name']}].value",
                    "env-reference",
                    f"$({name}) is not defined before {env['name']} in this container: Kubernetes leaves "
                    "the text unexpanded",
                )
        defined.add(str(env["name"]))
    if env_from is None:
        return
    defined |= env_from
    texts = [
        (f"{at}.{part}[{i}]", str(arg))
        for part in ("command", "args")
        for i, arg in enumerate(container.get(part) or [])
    ]
    texts += [
        (f"{at}.volumeMounts[{m['name']}].subPathExpr", str(m["subPathExpr"]))
        for m in container.get("volumeMounts") or []
        if "subPathExpr" in m
    ]
    for field, text in texts:
        for name in variable_references(text):
            if name not in defined:
                yield (
                    field,
                    "env-reference",
                    f"$({name}) names no variable of this container: Kubernetes passes the text unexpanded",
                )


def _check_probes(container: Manifest, at: str) -> Iterator[Problem]:
    ports = container.get("ports") or []
    names = {str(p["name"]) for p in ports if p.get("name")}
    numbers = {int(p["containerPort"]) for p in ports}
    for probe_name in _PROBES:
        probe = container.get(probe_name) or {}
        for handler in ("httpGet", "tcpSocket", "grpc"):
            if handler not in probe or "port" not in probe[handler]:
                continue
            port = probe[handler]["port"]
            declared = port in names if isinstance(port, str) else int(port) in numbers
            if not declared:
                yield (
                    f"{at}.{probe_name}.{handler}.port",
                    "probe-port",
                    f"port {port!r} is not one of the container's ports "
                    f"({', '.join(sorted(names)) or ', '.join(map(str, sorted(numbers))) or 'none'}): "
                    + (
                        "the kubelet cannot resolve the name"
                        if isinstance(port, str)
                        else "nothing declared listens there"
                    ),
                )


def _check_ports(pod: Manifest, at: str) -> Iterator[Problem]:
    by_port: dict[tuple[int, str], str] = {}
    by_name: dict[str, str] = {}
    for container in pod.get("containers") or []:
        for port in container.get("ports") or []:
            key = (int(port["containerPort"]), str(port.get("protocol", "TCP")))
            label = port.get("name") or key[0]
            field = f"{at}.containers[{container['name']}].ports[{label}]"
            if key in by_port:
                yield (
                    f"{field}.containerPort",
                    "port-collision",
                    f"{key[0]}/{key[1]} is also container {by_port[key]!r}'s: the pod's containers share "
                    "one network namespace and the second bind fails",
                )
            by_port.setdefault(key, container["name"])
            if port.get("name"):
                if port["name"] in by_name:
                    yield (
                        f"{field}.name",
                        "port-collision",
                        f"port name {port['name']!r} is used twice in the pod",
                    )
                by_name.setdefault(port["name"], container["name"])


def pod_specs(manifests: Iterable[Manifest]) -> Iterator[tuple[Manifest, Manifest, str]]:
    """(object, pod spec, the spec's field path) of every object that runs pods."""
    for m in manifests:
        path = POD_TEMPLATE_PATHS.get(str(m.get("kind")))
        if path is None:
            continue
        spec: Any = m
        for part in path:
            spec = (spec or {}).get(part)
        if spec:
            yield m, spec, ".".join(path)


def _check_pod(
    workload: Manifest,
    pod: Manifest,
    at: str,
    created: dict[ObjectKey, Manifest],
    prerequisites: list[str],
) -> Iterator[Problem]:
    namespace = object_key(workload)[0]
    for field, kind, name, optional in references(pod, at):
        known = (namespace, kind, str(name)) in created
        if not (known or optional or any(fnmatch.fnmatchcase(f"{kind}/{name}", p) for p in prerequisites)):
            yield (
                field,
                "reference",
                f"{kind} {name!r} is neither created by these manifests nor a prerequisite: the pod "
                "waits in ContainerCreating (or is refused) until it exists",
            )
    volumes = {str(v["name"]): v for v in pod.get("volumes") or []}
    claim_templates = (
        {str(t["metadata"]["name"]) for t in (workload.get("spec") or {}).get("volumeClaimTemplates") or []}
        if workload.get("kind") == "StatefulSet"
        else set()
    )
    files_of = {
        name: projected_files(v, namespace, created)
        for name, v in volumes.items()
        if _volume_type(v) in READ_ONLY_VOLUME_TYPES
    }
    for group in ("initContainers", "containers"):
        for container in pod.get(group) or []:
            c_at = f"{at}.{group}[{container['name']}]"
            yield from _check_mounts(container, c_at, volumes, claim_templates, files_of)
            yield from _check_env(container, c_at, env_from_names(container, namespace, created))
            yield from _check_probes(container, c_at)
    yield from _check_ports(pod, at)


def check_manifests(manifests: list[Manifest], prerequisites: Iterable[str] = ()) -> list[KubeFinding]:
    """Every finding over the manifests (rendered objects: what `kubectl kustomize` prints). `prerequisites`
    are `Kind/name` patterns of objects the cluster must hold beforehand (fnmatch)."""
    created = created_objects(manifests)
    wanted = list(prerequisites)
    findings = []
    for workload, pod, at in pod_specs(manifests):
        label = f"{workload['kind']}/{workload['metadata']['name']}"
        findings += [
            KubeFinding(label, field, rule, message)
            for field, rule, message in _check_pod(workload, pod, at, created, wanted)
        ]
    return findings
