"""What a service needs to open sandboxes on this host: its launcher (over its own sandbox uids, for
launchers that use them), the configured limits, the base PATH a sandbox gets and the repository root it
may see.

Both the runner (harness executions) and the evaluator (verifier runs) open sandboxes; this is the one
place that turns their `sandbox:` section into a launcher, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gyre.config import ConfigError, GyreConfig
from gyre.config.runner import EvaluatorSection, RunnerSection
from gyre.sandbox.launchers import AUTO_LAUNCHER, LauncherSpec, SandboxError, SandboxLauncher, launcher_class
from gyre.sandbox.launchers.base import LABEL_RUN, LABEL_RUN_DIR, LABEL_SERVICE
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.uids import check_disjoint, uid_range

if TYPE_CHECKING:
    from gyre.service import GyreService

#: The PATH every sandbox starts from (harnesses add their own bin directories in front).
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def open_sandbox(
    service: GyreService, section: RunnerSection | EvaluatorSection, on_host: bool = False
) -> tuple[SandboxLauncher, SandboxLimits]:
    """The service instance's launcher and the configured limits. `on_host`: the launcher of commands
    that run on this host whatever the configured launcher is (`auto`'s when that one runs sandboxes with
    their own filesystem: the evaluator's score_line verifiers)."""
    check_verifier_sandbox(service.config)
    box = section.sandbox
    cls = host_class(box.isolation) if on_host else launcher_class(box.isolation)
    uids = None
    if cls.uses_uids:
        uids = uid_range(box.uid_base, service.instance, section.max_concurrent)
        check_sandbox_uids(service.config, **{service.name: uids})
    spec = LauncherSpec(
        section=box,
        num_slots=section.max_concurrent,
        uids=uids,
        labels={**run_labels(service.config), LABEL_SERVICE: service.instance_name},
        work_dir=service.config.run.path.resolve(),
    )
    try:
        launcher = cls.create(spec)
    except SandboxError as e:
        raise ConfigError(f"{service.name}.sandbox.isolation {box.isolation}: {e}") from None
    service.log.info("sandbox_enforced", **launcher.enforced())
    return launcher, SandboxLimits(
        box.cpu_s, box.memory_mb, box.max_processes, box.file_size_mb, box.open_files
    )


def run_labels(config: GyreConfig) -> dict[str, str]:
    """The labels every kept sandbox of the run carries (how `gyre down` finds them)."""
    return {LABEL_RUN: config.run.id, LABEL_RUN_DIR: str(config.run.path.resolve())}


def _sections(config: GyreConfig) -> list[tuple[str, RunnerSection | EvaluatorSection]]:
    return [("runner", config.runner), ("evaluator", config.evaluator)]


def check_verifier_sandbox(config: GyreConfig) -> None:
    """A runner whose launcher gives each execution a filesystem of its own (`own_filesystem`) needs the
    evaluator on that launcher too: the verifier runs in the execution's sandbox after the harness.
    `ConfigError` otherwise (`gyre up` and each service's start)."""
    runner, evaluator = config.runner.sandbox.isolation, config.evaluator.sandbox.isolation
    if launcher_class(runner).own_filesystem and launcher_class(evaluator) is not launcher_class(runner):
        raise ConfigError(
            f"runner.sandbox.isolation {runner} needs evaluator.sandbox.isolation {runner} too: the verifier "
            f"runs in the execution's sandbox after the harness; got {evaluator!r}"
        )


def check_sandboxes(config: GyreConfig) -> list[str]:
    """Before a run starts: the evaluator can verify where the runner's harness ran, and each service's
    launcher can run here (for `container`: its engine answers); `ConfigError` naming the field and why
    not. Returns what each uses."""
    check_verifier_sandbox(config)
    found = []
    for name, section in _sections(config):
        box = section.sandbox
        cls = launcher_class(box.isolation)
        uids = uid_range(box.uid_base, 0, section.max_concurrent) if cls.uses_uids else None
        spec = LauncherSpec(
            section=box, num_slots=section.max_concurrent, uids=uids, labels=run_labels(config)
        )
        try:
            found.append(f"{name}: {cls.check(spec)}")
        except SandboxError as e:
            raise ConfigError(f"{name}.sandbox.isolation {box.isolation}: {e}") from None
    return found


def remove_run_sandboxes(config: GyreConfig) -> int:
    """Remove every sandbox the run's launchers kept (its containers), wherever they stand."""
    removed = 0
    done: set[tuple[str, str | None]] = set()
    for _, section in _sections(config):
        box = section.sandbox
        cls = launcher_class(box.isolation)
        key = (cls.name, box.container.endpoint)
        if cls.own_filesystem and key not in done:
            done.add(key)
            removed += cls.remove_all(LauncherSpec(section=box, labels=run_labels(config)))
    return removed


def host_class(isolation: str) -> type[SandboxLauncher]:
    """The launcher of commands that run on this host under `isolation`."""
    cls = launcher_class(isolation)
    return launcher_class(AUTO_LAUNCHER) if cls.own_filesystem else cls


def check_sandbox_uids(config: GyreConfig, **mine: range) -> None:
    """Refuse to start when this instance's sandbox uids overlap the first ones of another service whose
    launchers use uids (only those: a sweep kills every process of a uid)."""
    ranges = {
        name: uid_range(section.sandbox.uid_base, 0, section.max_concurrent)
        for name, section in (("runner", config.runner), ("evaluator", config.evaluator))
        if launcher_class(section.sandbox.isolation).uses_uids
        or (name == "evaluator" and host_class(section.sandbox.isolation).uses_uids)
    }
    try:
        check_disjoint(**{**ranges, **mine})
    except ValueError as e:
        raise ConfigError(str(e)) from None
