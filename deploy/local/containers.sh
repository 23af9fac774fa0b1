#!/usr/bin/env bash
# The container engine of the `container` sandbox launcher and the compose deployment, on a machine where
# no image registry is reachable (run by `make setup`; needs root for podman):
#
#   bash deploy/local/containers.sh base      build the local Debian base images unless they exist
#   bash deploy/local/containers.sh service   start podman's Docker-API service unless it answers
#   bash deploy/local/containers.sh setup     both
#
# The base image is Debian bookworm made by debootstrap (--variant=minbase: bash, coreutils, apt; no
# python) from Debian's own package mirror, imported as localhost/gyre/debian-base:bookworm — a local
# image named for what it is. localhost/gyre/debian-python:bookworm is that plus Debian's python3 (3.11):
# what the demo harness needs in a container (its packages are mounted from the runner's host). Tests
# whose task Dockerfiles say `FROM debian:bookworm-slim` tag the base with that name themselves (and say
# so). The API service listens on /run/podman/podman.sock, podman's standard rootful socket, which is
# where Gyre's container launcher looks when DOCKER_HOST is unset.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
BASE_IMAGE="${GYRE_BASE_IMAGE:-localhost/gyre/debian-base:bookworm}"
PYTHON_IMAGE="${GYRE_PYTHON_IMAGE:-localhost/gyre/debian-python:bookworm}"
MIRROR="${GYRE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SOCKET="${GYRE_PODMAN_SOCKET:-/run/podman/podman.sock}"

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: $1 needs root (rootful podman with runc; README, 'Container sandboxes')" >&2
    exit 1
  fi
}

base() {
  need_root "building the base image"
  if podman image exists "$BASE_IMAGE"; then
    return 0
  fi
  local dir
  dir="$(mktemp -d /var/tmp/gyre-base.XXXXXX)"
  trap 'rm -rf "$dir"' RETURN
  echo "building $BASE_IMAGE (debootstrap bookworm from $MIRROR, about a minute)"
  debootstrap --variant=minbase bookworm "$dir/rootfs" "$MIRROR" >"$dir/debootstrap.log" 2>&1 || {
    tail -20 "$dir/debootstrap.log" >&2
    echo "error: debootstrap of bookworm from $MIRROR failed" >&2
    exit 1
  }
  rm -rf "$dir"/rootfs/var/cache/apt/archives/*.deb "$dir"/rootfs/var/lib/apt/lists/*
  tar -C "$dir/rootfs" -c . | podman import --quiet \
    --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$BASE_IMAGE" >/dev/null
  echo "built $BASE_IMAGE"
}

python_image() {
  need_root "building the python image"
  if podman image exists "$PYTHON_IMAGE"; then
    return 0
  fi
  echo "building $PYTHON_IMAGE ($BASE_IMAGE + Debian's python3 over plain HTTP, under a minute)"
  local context
  context="$(mktemp -d /var/tmp/gyre-python.XXXXXX)"
  trap 'rm -rf "$context"' RETURN
  printf 'FROM %s\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null && rm -rf /var/lib/apt/lists/*\n' \
    "$BASE_IMAGE" | podman build --quiet --tag "$PYTHON_IMAGE" --file - "$context" >/dev/null 2>"$context/build.log" || {
    tail -20 "$context/build.log" >&2
    echo "error: building $PYTHON_IMAGE failed" >&2
    exit 1
  }
  echo "built $PYTHON_IMAGE"
}

answers() {
  python3 - "$SOCKET" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
try:
    s.connect(sys.argv[1])
    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
    sys.exit(0 if b" 200 " in s.recv(64) else 1)
except OSError:
    sys.exit(1)
PY
}

service() {
  need_root "the podman API service"
  if answers; then
    return 0
  fi
  mkdir -p "$(dirname "$SOCKET")"
  rm -f "$SOCKET"
  # From /: conmon writes an `oom` file into the service's working directory when a container is
  # OOM-killed (the sandbox tests do that), which would otherwise land in the checkout.
  (cd / && setsid nohup podman system service --time=0 "unix://$SOCKET" \
    >"$(dirname "$SOCKET")/gyre-podman-service.log" 2>&1 </dev/null &)
  for _ in $(seq 1 100); do
    if answers; then
      echo "podman API service on unix://$SOCKET"
      return 0
    fi
    sleep 0.1
  done
  echo "error: podman system service did not answer on $SOCKET within 10 s" >&2
  exit 1
}

subids() {
  # sandbox.container.userns: auto (the default) gives each container a user namespace drawn from the
  # `containers` range, so container root is not host root.
  need_root "the containers subordinate id range"
  for f in /etc/subuid /etc/subgid; do
    touch "$f"
    grep -q '^containers:' "$f" || echo "containers:2147483647:2147483648" >> "$f"
  done
}

case "${1:-setup}" in
  base) base; python_image ;;
  service) subids; service ;;
  setup) base; python_image; subids; service ;;
  *) echo "usage: $0 base|service|setup" >&2; exit 2 ;;
esac
