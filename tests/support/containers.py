"""The container engine for tests: it must answer (a failure under CI, a skip with the reason elsewhere),
every container a test session creates carries the session's label (`SESSION_LABELS`, set for the whole
session by tests/conftest.py through GYRE_SANDBOX_LABELS, which subprocesses inherit), and what a test
leaves behind is found by that label only: the engine's state is shared with whatever else runs here."""

from __future__ import annotations

import os

import docker

from gyre.config.runner import LOCAL_BASE_IMAGE
from gyre.sandbox.launchers.base import EXTRA_LABELS_ENV
from tests.support.sandboxes import unavailable

SESSION_LABEL = "gyre.test-session"
#: The local Debian base plus python3 (deploy/local/containers.sh): what the demo harness needs.
PYTHON_IMAGE = "localhost/gyre/debian-python:bookworm"


def session_labels() -> dict[str, str]:
    key, _, value = os.environ[EXTRA_LABELS_ENV].partition("=")
    assert key == SESSION_LABEL, os.environ[EXTRA_LABELS_ENV]
    return {key: value}


def engine_client(*images: str) -> docker.DockerClient:
    """A client of the engine the container launcher uses, with `images` (default: the local base) on
    this host; else the test fails under CI and is skipped elsewhere."""
    from gyre.sandbox.containers.engine import ContainerEngineError, connect, resolve_endpoint

    endpoint = resolve_endpoint(None)
    try:
        client = connect(endpoint, 30.0)
    except ContainerEngineError as e:
        unavailable(f"{e} (as root: bash deploy/local/containers.sh setup, or make setup)")
        raise
    for image in images or (LOCAL_BASE_IMAGE,):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            unavailable(f"image {image} is missing (as root: bash deploy/local/containers.sh base)")
    return client


def containers_of(client: docker.DockerClient, **labels: str) -> list[str]:
    """Names of this session's containers carrying `labels` (running or not)."""
    from gyre.sandbox.containers.engine import find

    return sorted(c.name for c in find(client, {**session_labels(), **labels}))
