"""What a service needs to open sandboxes on this host: its launcher over its own sandbox uids, the
configured limits, the base PATH a sandbox gets and the repository root it may see.

Both the runner (harness executions) and the evaluator (verifier runs) open sandboxes; this is the one
place that turns their `sandbox:` section into a launcher, so the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gyre.config import ConfigError, GyreConfig
from gyre.config.runner import EvaluatorSection, RunnerSection
from gyre.sandbox.launcher import SandboxLauncher, make_launcher
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.uids import check_disjoint, uid_range

if TYPE_CHECKING:
    from gyre.service import GyreService

#: The repository root: revealed read-only to sandboxes that run Gyre's own code (the demo harness, verifiers).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The PATH every sandbox starts from (harnesses add their own bin directories in front).
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def open_sandbox(
    service: GyreService, section: RunnerSection | EvaluatorSection
) -> tuple[SandboxLauncher, SandboxLimits]:
    """The service instance's launcher over its own sandbox uids, and the configured limits."""
    box = section.sandbox
    uids = uid_range(box.uid_base, service.instance, section.max_concurrent)
    check_sandbox_uids(service.config, **{service.name: uids})
    launcher = make_launcher(box.isolation, uids.start, len(uids))
    service.log.info("sandbox_enforced", **launcher.enforced())
    return launcher, SandboxLimits(
        box.cpu_s, box.memory_mb, box.max_processes, box.file_size_mb, box.open_files
    )


def check_sandbox_uids(config: GyreConfig, **mine: range) -> None:
    """Refuse to start when this instance's sandbox uids overlap the other service's first ones."""
    ranges = {
        "runner": uid_range(config.runner.sandbox.uid_base, 0, config.runner.max_concurrent),
        "evaluator": uid_range(config.evaluator.sandbox.uid_base, 0, config.evaluator.max_concurrent),
        **mine,
    }
    try:
        check_disjoint(**ranges)
    except ValueError as e:
        raise ConfigError(str(e)) from None
