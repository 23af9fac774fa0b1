"""When to restart a process that exited: exponential backoff within a restart budget (no I/O, no clock).

    history = RestartHistory()
    decision = history.on_exit(now_s=12.0, policy=config.run.supervisor)
    decision.restart, decision.delay_s, decision.num_restarts    # True, 0.5, 1

Restarts count within a sliding window (`restart_window_s`): the n-th restart in the window waits
`backoff_initial_s · backoff_factor^(n-1)` seconds (at most `backoff_max_s`); the exit after
`max_restarts` restarts in the window gives up. A process that stays up longer than the window
therefore starts over at the initial delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.config.supervisor import SupervisorSection


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """What the supervisor does after one exit."""

    restart: bool
    """Restart the process (False: give up and stop the run)."""
    delay_s: float
    """Seconds to wait before the restart (0 when giving up)."""
    num_restarts: int
    """Restarts within the window, this one included when `restart`."""


@dataclass(slots=True)
class RestartHistory:
    """The restart times of one process (seconds on the supervisor's monotonic clock)."""

    restarts_s: list[float] = field(default_factory=list)

    def on_exit(self, now_s: float, policy: SupervisorSection) -> RestartDecision:
        """Decide on the exit at `now_s`; records the restart when there is one."""
        self.restarts_s = [t for t in self.restarts_s if now_s - t < policy.restart_window_s]
        n = len(self.restarts_s)
        if not policy.restart or n >= policy.max_restarts:
            return RestartDecision(False, 0.0, n)
        delay_s = min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_factor**n)
        self.restarts_s.append(now_s)
        return RestartDecision(True, delay_s, n + 1)
