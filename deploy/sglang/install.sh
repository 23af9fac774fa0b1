#!/usr/bin/env bash
# Installs SGLang into its own environment for `cell_agent.engine.backend: sglang` (run by `make setup`):
#
#   bash deploy/sglang/install.sh [VENV]        # default .venv-sglang; then sglang_python: VENV/bin/python
#
# SGLang pins differ from Gyre's (transformers, torch), so it gets its own venv. Steps: the exact packages
# of deploy/sglang/lock.txt with --no-deps; Gyre's CPU kernel shim (cpu_kernel_shim/) where no real
# `sgl_kernel` is installed; torchvision's registration guard (patch_torchvision.py); an import check.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-.venv-sglang}"
python="${PYTHON:-python3}"
py="$venv/bin/python"

[ -x "$py" ] || "$python" -m venv "$venv"
"$py" -m pip install -q --no-deps -r "$here/lock.txt"

origin="$("$py" -c 'import importlib.util as u; s = u.find_spec("sgl_kernel"); print(s.origin if s else "")')"
if [ -z "$origin" ] || "$py" -c 'import sgl_kernel, sys; sys.exit(0 if getattr(sgl_kernel, "IS_GYRE_CPU_SHIM", False) else 1)' 2>/dev/null; then
    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the repository.
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' EXIT
    cp -r "$here/cpu_kernel_shim/." "$build/"
    "$py" -m pip install -q --no-deps --force-reinstall "$build"
else
    echo "note: $origin is SGLang's own kernel package; Gyre's CPU shim is not installed"
fi

"$py" "$here/patch_torchvision.py"
"$py" -W ignore -c 'import sys, sglang, sglang.srt.entrypoints.http_server, sgl_kernel, torchvision
print("sglang", sglang.__version__, "installed in", sys.prefix)'
