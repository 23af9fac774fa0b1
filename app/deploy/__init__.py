"""Checks of the deployment files that need no cluster: `kube_check.py` models the kubelet's rules a pod dies
of over rendered Kubernetes manifests (`gyre deploy check-kube OVERLAY`), reading what the pods use and what
the manifests create through `kube_objects.py`; `kustomize.py` renders an overlay with `kubectl kustomize`.
`access.py` writes what each TLS identity may do on NATS and Redis (permissions.conf, users.acl)."""
