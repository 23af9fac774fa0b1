"""Fixtures of the deployment tests: the compose file, the rendered overlays (once per session), the configs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gyre.config import GyreConfig, load_config
from tests.unit.deploy.support import (
    COMPOSE_CONFIG,
    COMPOSE_FILE,
    K8S,
    K8S_CONFIG,
    OVERLAYS,
    Manifest,
    render_kustomization,
)


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Manifest]]:
    """Every overlay rendered once per session: {"cpu": [...objects], "gpu": [...]}."""
    return {overlay: render_kustomization(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="session")
def compose_config() -> GyreConfig:
    return load_config(COMPOSE_CONFIG, environ={})


@pytest.fixture(scope="session")
def k8s_config() -> GyreConfig:
    return load_config(K8S_CONFIG, environ={})
