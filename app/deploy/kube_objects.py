"""What the pods of rendered manifests use by name and what the manifests create, for the kubelet rules of
app/deploy/kube_check.py: the objects created (a cert-manager Certificate creates its Secret), the files a
ConfigMap/Secret/projected volume holds, the variables `envFrom` brings in, every reference a pod makes.

    created = created_objects(objects)              # (namespace, kind, name) → object
    for field, kind, name, optional in references(pod_spec, "spec.template.spec"): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Manifest = dict[str, Any]
ObjectKey = tuple[str, str, str]
"""(namespace, kind, name)."""

DATA_FIELDS = {"data", "binaryData", "stringData"}


def object_key(m: Manifest) -> ObjectKey:
    meta = m.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(m.get("kind")), str(meta.get("name"))


def created_objects(manifests: list[Manifest]) -> dict[ObjectKey, Manifest]:
    """Every object the manifests create, cert-manager Certificates' secrets included."""
    created = {object_key(m): m for m in manifests}
    for m in manifests:
        if m.get("kind") == "Certificate" and (secret := (m.get("spec") or {}).get("secretName")):
            namespace = object_key(m)[0]
            created.setdefault((namespace, "Secret", str(secret)), {"kind": "Secret"})
    return created


def projected_files(volume: Manifest, namespace: str, created: dict[ObjectKey, Manifest]) -> set[str] | None:
    """The file names a read-only volume holds, or None where the manifests do not say (a Secret made
    outside them, a downwardAPI volume's items are always listed)."""

    def source_files(kind: str, source: Manifest, name_field: str) -> set[str] | None:
        if source.get("items"):
            return {str(item["path"]) for item in source["items"]}
        obj = created.get((namespace, kind, str(source.get(name_field))))
        if obj is None or not DATA_FIELDS & obj.keys():
            return None
        return {*(obj.get("data") or {}), *(obj.get("binaryData") or {}), *(obj.get("stringData") or {})}

    if "configMap" in volume:
        return source_files("ConfigMap", volume["configMap"], "name")
    if "secret" in volume:
        return source_files("Secret", volume["secret"], "secretName")
    if "downwardAPI" in volume:
        return {str(item["path"]) for item in volume["downwardAPI"].get("items") or []}
    files: set[str] = set()
    for source in volume["projected"].get("sources") or []:
        for kind, name_field, kind_name in (
            ("configMap", "name", "ConfigMap"),
            ("secret", "name", "Secret"),
        ):
            if kind in source:
                found = source_files(kind_name, source[kind], name_field)
                if found is None:
                    return None
                files |= found
        if "downwardAPI" in source:
            files |= {str(item["path"]) for item in source["downwardAPI"].get("items") or []}
        if "serviceAccountToken" in source:
            files.add(str(source["serviceAccountToken"]["path"]))
    return files


def env_from_names(
    container: Manifest, namespace: str, created: dict[ObjectKey, Manifest]
) -> set[str] | None:
    """Variables `envFrom` brings in, or None where a source is not in the manifests (any name may exist)."""
    names: set[str] = set()
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        if "configMapRef" in source:
            kind, ref = "ConfigMap", source["configMapRef"]
        else:
            kind, ref = "Secret", source.get("secretRef") or {}
        obj = created.get((namespace, kind, str(ref.get("name"))))
        if obj is None or not DATA_FIELDS & obj.keys():
            return None
        names |= {prefix + k for field in DATA_FIELDS for k in obj.get(field) or {}}
    return names


def references(pod: Manifest, at: str) -> Iterator[tuple[str, str, str, bool]]:
    """(field, kind, name, optional) of every object the pod uses by name."""
    for volume in pod.get("volumes") or []:
        field = f"{at}.volumes[{volume['name']}]"
        if "configMap" in volume:
            yield (
                f"{field}.configMap.name",
                "ConfigMap",
                volume["configMap"].get("name"),
                bool(volume["configMap"].get("optional")),
            )
        if "secret" in volume:
            yield (
                f"{field}.secret.secretName",
                "Secret",
                volume["secret"].get("secretName"),
                bool(volume["secret"].get("optional")),
            )
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            yield f"{field}.persistentVolumeClaim.claimName", "PersistentVolumeClaim", claim, False
        for i, source in enumerate((volume.get("projected") or {}).get("sources") or []):
            for kind_field, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
                if kind_field in source:
                    ref = source[kind_field]
                    yield (
                        f"{field}.projected.sources[{i}].{kind_field}.name",
                        kind,
                        ref.get("name"),
                        bool(ref.get("optional")),
                    )
    for group in ("initContainers", "containers"):
        for container in pod.get(group) or []:
            c_at = f"{at}.{group}[{container['name']}]"
            for env in container.get("env") or []:
                source = env.get("valueFrom") or {}
                for ref_field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                    if ref_field in source:
                        ref = source[ref_field]
                        field = f"{c_at}.env[{env['name']}].valueFrom.{ref_field}.name"
                        yield field, kind, ref.get("name"), bool(ref.get("optional"))
            for i, source in enumerate(container.get("envFrom") or []):
                for ref_field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                    if ref_field in source:
                        ref = source[ref_field]
                        field = f"{c_at}.envFrom[{i}].{ref_field}.name"
                        yield field, kind, ref.get("name"), bool(ref.get("optional"))
    for i, secret in enumerate(pod.get("imagePullSecrets") or []):
        yield f"{at}.imagePullSecrets[{i}].name", "Secret", secret.get("name"), False
    account = pod.get("serviceAccountName")
    if account and account != "default":
        yield f"{at}.serviceAccountName", "ServiceAccount", account, False
