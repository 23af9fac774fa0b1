# Gyre — the two commands are `make demo` and `make test`; both run `setup` first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYS_STAMP := $(VENV)/.system-deps
NPM_STAMP := node_modules/.installed
PROTO_STAMP := gyre/v1/.generated
PROTOS := $(wildcard protos/gyre/v1/*.proto)
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_INPUTS := $(wildcard deploy/sglang/*.txt deploy/sglang/*.sh deploy/sglang/*.py) \
	$(wildcard deploy/sglang/cpu_kernel_shim/pyproject.toml deploy/sglang/cpu_kernel_shim/sgl_kernel/*.py)
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup containers sglang test demo lint bench protos up down clean npm

setup: $(SYS_STAMP) $(STAMP) $(PROTO_STAMP) $(NPM_STAMP) $(SGLANG_STAMP) containers

# The container engine (rootful podman + runc, deploy/local/containers.conf), the local Debian base image
# and podman's Docker-API service: idempotent, a fraction of a second when all are there. Needs root;
# without root it says what is missing and the container tests say they cannot run.
containers: $(SYS_STAMP)
	@if [ "$$(id -u)" -eq 0 ]; then bash deploy/local/containers.sh setup; \
	else echo "note: not root: the container engine is not set up (bash deploy/local/containers.sh setup as root)"; fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstall only when the project metadata or the constraints change; the install is editable, and held to
# the versions the suite was verified with (constraints.txt says why).
$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,mooncake,megatron,wandb,mlflow]'
	@touch $@

$(SYS_STAMP): deploy/local/system-deps.sh | $(VENV)/bin/python
	bash deploy/local/system-deps.sh
	@touch $@

# The real harness CLIs (Claude Code, Codex) that the proxy conformance tests drive.
$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# SGLang in its own environment (its pins are not Gyre's): the exact packages of deploy/sglang/lock.txt and,
# where SGLang's kernel package has no build (CPUs), Gyre's CPU kernel shim. ~2 min from scratch; nothing
# when the stamp is newer than its inputs. `cell_agent.engine.sglang_python: .venv-sglang/bin/python`.
sglang: $(SGLANG_STAMP)

$(SGLANG_STAMP): $(SGLANG_INPUTS)
	PYTHON=$(PYTHON) bash deploy/sglang/install.sh $(SGLANG_VENV)
	@touch $@

protos: $(PROTO_STAMP)

$(PROTO_STAMP): $(PROTOS) $(STAMP)
	rm -rf gyre/v1
	mkdir -p gyre/v1
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTOS)
	printf '"""Generated protobuf and gRPC code for protos/gyre/v1 (built by `make protos`)."""\n' > gyre/v1/__init__.py
	@touch $@

# A hard bound under CI's limit: a hang (a test's process that will not exit) fails the run instead
# of eating CI's whole budget; pytest's per-test timeout (pyproject) catches most hangs first.
TEST_BOUND_S ?= 4200
test: setup
	timeout --kill-after=30 $(TEST_BOUND_S) $(PY) -m pytest -q tests

demo: setup
	$(VENV)/bin/gyre demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/gyre bench --list

up: setup
	$(VENV)/bin/gyre up --detach

down:
	$(VENV)/bin/gyre down

clean:
	rm -rf $(VENV) $(SGLANG_VENV) gyre/v1 runs .pytest_cache .mypy_cache .ruff_cache *.egg-info
