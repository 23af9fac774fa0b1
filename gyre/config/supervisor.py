"""Config of the local stack's supervisor (`run.supervisor`): restarts with backoff and a budget, bounded stops.

The supervisor (app/stack/supervisor.py) owns every process of a `gyre up` / `gyre demo` run. A process
that exits while the run is up is restarted after `backoff_initial_s · backoff_factor^n` seconds (n = its
restarts within `restart_window_s`, capped at `backoff_max_s`); its `max_restarts + 1`-th exit within the
window stops the run — except a satellite's cell agent, whose cell is then lost for good: the scheduler
removes it from the pool and the run goes on without it. A stop — `gyre down`, SIGTERM/SIGINT, the parent dying — SIGTERMs every service at
once, SIGKILLs what is left after `stop_grace_s`, then stops NATS and Redis the same way within
`server_stop_grace_s`: every process of the run is gone within `stop_bound_s` (20 s with the defaults).
Compose and Kubernetes use their own restart policies instead (deploy/).
"""

from __future__ import annotations

from pydantic import model_validator

from gyre.config.base import NonNegativeFloat, NonNegativeInt, PositiveFloat, Section


class SupervisorSection(Section):
    restart: bool = True
    """Restart a service, nats-server or redis-server that exits while the run is up (False: any exit
    stops the run, but a satellite's cell agent's, which removes its cell from the pool)."""
    max_restarts: NonNegativeInt = 5
    """Restarts of one process allowed within `restart_window_s`; one more exit stops the run (a satellite's
    cell agent's removes its cell from the pool instead)."""
    restart_window_s: PositiveFloat = 600.0
    """Window over which restarts count against `max_restarts` (and set the backoff exponent)."""
    backoff_initial_s: NonNegativeFloat = 0.5
    """Delay before the first restart of a process within the window."""
    backoff_factor: PositiveFloat = 2.0
    """Each further restart within the window waits this many times longer (must be >= 1)."""
    backoff_max_s: NonNegativeFloat = 30.0
    """Cap on one restart delay."""
    stop_grace_s: PositiveFloat = 10.0
    """At a stop, seconds between SIGTERM to every service and SIGKILL of what is left (their process trees)."""
    service_stop_timeout_s: PositiveFloat = 8.0
    """A service's own cap on its shutdown: past it the service exits at once (must be < `stop_grace_s`, so a
    service ends itself even when nothing is left to SIGKILL it, e.g. after its supervisor was killed)."""
    server_stop_grace_s: PositiveFloat = 3.0
    """Seconds between SIGTERM and SIGKILL for nats-server and redis-server (stopped after the services)."""

    @model_validator(mode="after")
    def _consistent(self) -> SupervisorSection:
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be >= 1 (delays never shrink); got {self.backoff_factor}")
        if self.service_stop_timeout_s >= self.stop_grace_s:
            raise ValueError(
                f"service_stop_timeout_s ({self.service_stop_timeout_s}) must be < stop_grace_s ({self.stop_grace_s}):"
                " raise stop_grace_s or lower service_stop_timeout_s"
            )
        return self

    @property
    def stop_bound_s(self) -> float:
        """Upper bound on a whole stop: services' grace, servers' grace, and a second for each SIGKILL."""
        return self.stop_grace_s + self.server_stop_grace_s + 2.0
