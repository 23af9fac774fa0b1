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
from gyre.sandbox.launchers import LauncherSpec, SandboxLauncher, launcher_class
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.uids import check_disjoint, uid_range

if TYPE_CHECKING:
    from gyre.service import GyreService

#: The PATH every sandbox starts from (harnesses add their own bin directories in front).
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def open_sandbox(
    service: GyreService, section: RunnerSection | EvaluatorSection
) -> tuple[SandboxLauncher, SandboxLimits]:
    """The service instance's launcher and the configured limits."""
    box = section.sandbox
    cls = launcher_class(box.isolation)
    uids = None
    if cls.uses_uids:
        uids = uid_range(box.uid_base, service.instance, section.max_concurrent)
        check_sandbox_uids(service.config, **{service.name: uids})
    launcher = cls.create(LauncherSpec(section=box, num_slots=section.max_concurrent, uids=uids))
    service.log.info("sandbox_enforced", **launcher.enforced())
    return launcher, SandboxLimits(
        box.cpu_s, box.memory_mb, box.max_processes, box.file_size_mb, box.open_files
    )


def check_sandbox_uids(config: GyreConfig, **mine: range) -> None:
    """Refuse to start when this instance's sandbox uids overlap the first ones of another service whose
    launcher uses uids (only those: a sweep kills every process of a uid)."""
    ranges = {
        name: uid_range(section.sandbox.uid_base, 0, section.max_concurrent)
        for name, section in (("runner", config.runner), ("evaluator", config.evaluator))
        if launcher_class(section.sandbox.isolation).uses_uids
    }
    try:
        check_disjoint(**{**ranges, **mine})
    except ValueError as e:
        raise ConfigError(str(e)) from None
