"""The image recipe, read (tests/integration/test_compose_cluster.py builds and runs it with podman): a
Debian bookworm base as a build argument, the torch pin, protos generated as `make protos` does, every
package of pyproject copied and admitted by .dockerignore, Node.js and the CLIs of package-lock.json, a
non-root user, no secret, the Mooncake system library, the ports exposed.

    PYTHONPATH=. python -m pytest -q tests/unit/deploy/test_dockerfile.py
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass

import pytest

from gyre.config import GyreConfig
from tests.unit.deploy.support import DEPLOY, REPO

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    value: str


def stages() -> list[list[Instruction]]:
    """The Dockerfile's instructions (continuations joined, comments dropped), split into build stages;
    the ARGs before the first FROM form stage 0."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "a continuation line ends the Dockerfile"
    result: list[list[Instruction]] = [[]]
    for entry in logical:
        keyword, _, value = entry.strip().partition(" ")
        if keyword.upper() == "FROM":
            result.append([])
        result[-1].append(Instruction(keyword.upper(), " ".join(value.split())))
    return result


def arg_default(name: str) -> str:
    for stage in stages():
        for ins in stage:
            if ins.keyword == "ARG" and ins.value.startswith(f"{name}="):
                return ins.value.split("=", 1)[1].strip('"')
    raise AssertionError(f"no ARG {name} with a default")


def pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_base_image_is_a_bookworm_build_argument() -> None:
    assert arg_default("BASE_IMAGE") == "debian:bookworm-slim"
    froms = [stage[0].value for stage in stages()[1:]]
    assert froms[0] == "${BASE_IMAGE} AS system", "the first stage starts from the build argument"
    assert all(f.split()[0] in ("system", "${BASE_IMAGE}") for f in froms), froms
    system = " ".join(i.value for i in stages()[1] if i.keyword == "RUN")
    assert "python3 python3-venv nodejs" in system, "Python 3.11 and Node.js from Debian's own packages"


def test_the_harness_clis_are_the_pinned_ones_on_path() -> None:
    system = stages()[1]
    copied = [i.value for i in system if i.keyword == "COPY"]
    assert copied == ["package.json package-lock.json /opt/gyre-clis/"]
    runs = " ".join(i.value for i in system if i.keyword == "RUN")
    assert "npm ci --omit=dev" in runs, "installed exactly as package-lock.json pins them"
    assert "purge -y -qq --auto-remove npm" in runs, "npm itself does not stay in the image"
    assert "/usr/local/bin/claude" in runs and "/usr/local/bin/codex" in runs


def test_python_packages_are_installed_by_the_pinned_uv_without_byte_compiling() -> None:
    (uv,) = [stage for stage in stages() if stage[0].value == "system AS uv"]
    assert '"uv==${UV_VERSION}"' in " ".join(i.value for i in uv if i.keyword == "RUN")
    assert re.fullmatch(r"\d+\.\d+\.\d+", arg_default("UV_VERSION"))
    runtime = stages()[-1]
    assert any(
        i.keyword == "COPY" and i.value == "--from=uv /opt/uv/bin/uv /usr/local/bin/uv" for i in runtime
    )
    runs = " ".join(i.value for i in runtime if i.keyword == "RUN")
    assert "uv pip install" in runs and "pip install" not in runs.replace("uv pip install", "")
    assert "--compile" not in runs, "nothing is byte-compiled at install; the import check compiles"


def test_torch_pin_matches_pyproject() -> None:
    deps = pyproject()["project"]["dependencies"]  # type: ignore[index]
    (pin,) = [d for d in deps if re.match(r"torch\s*==", d)]
    assert arg_default("TORCH_VERSION") == pin.split("==", 1)[1].strip()
    assert arg_default("TORCH_INDEX_URL").endswith("/whl/cpu")


def test_protos_are_generated_like_make_protos() -> None:
    makefile = (REPO / "Makefile").read_text()
    (make_cmd,) = re.findall(r"grpc_tools\.protoc ([^\n\\]+)", makefile)
    wanted = [a for a in shlex.split(make_cmd) if not a.startswith("--mypy")]
    runs = " ".join(i.value for i in stages()[-1] if i.keyword == "RUN")
    (docker_cmd,) = re.findall(r"grpc_tools\.protoc ([^&;]+)", runs)
    assert [a for a in shlex.split(docker_cmd) if not a.startswith("protos/")] == wanted
    assert "protos/gyre/v1/*.proto" in docker_cmd and "gyre/v1/__init__.py" in runs


def test_every_package_is_copied_and_admitted_by_dockerignore() -> None:
    includes = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]  # type: ignore[index]
    packages = {pattern.rstrip("*") for pattern in includes}
    runtime = [i.value for i in stages()[-1] if i.keyword == "COPY" and not i.value.startswith("--from")]
    assert runtime == ["pyproject.toml ./", ". ./"], "the dependencies' layer, then the whole context once"
    rules = [
        r.strip()
        for r in (REPO / ".dockerignore").read_text().splitlines()
        if r.strip() and not r.startswith("#")
    ]
    assert rules[0] == "*", "the build context is an allowlist: exclude everything first"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    wanted = packages | {"pyproject.toml", "README.md", "protos", "package.json", "package-lock.json"}
    assert wanted <= admitted, wanted - admitted
    for source in admitted:
        assert (REPO / source).exists(), source
    assert "gyre/v1/" in rules, "generated code is rebuilt in the image, never copied from a checkout"


def test_runtime_stage_is_non_root_with_mooncake_libraries() -> None:
    runtime = stages()[-1]
    (user,) = [i.value for i in runtime if i.keyword == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (runAsNonRoot checks it)"
    assert runtime[0].value == "system", "the image is the system stage plus what it installs"
    runs = " ".join(i.value for i in stages()[1] if i.keyword == "RUN")
    assert "libibverbs1" in runs and "rm -rf /var/lib/apt/lists/*" in runs


def test_no_secret_is_baked_in() -> None:
    secret = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
    for stage in stages():
        for ins in stage:
            if ins.keyword in ("ARG", "ENV", "LABEL"):
                assert not secret.search(ins.value), ins


@pytest.mark.parametrize("config_name", ["compose", "k8s"])
def test_exposed_ports_are_the_deploy_config_ports(
    config_name: str, compose_config: GyreConfig, k8s_config: GyreConfig
) -> None:
    config = {"compose": compose_config, "k8s": k8s_config}[config_name]
    (expose,) = [i.value for i in stages()[-1] if i.keyword == "EXPOSE"]
    ports = {
        config.scheduler.port,
        config.proxy.port,
        config.proxy.http_port,
        config.runner.port,
        config.evaluator.port,
        config.packer.port,
        *config.cell_agent.ports,
        *config.cell_agent.engine_ports,
        config.metrics.port,
    }
    assert {int(p) for p in expose.split()} == ports
