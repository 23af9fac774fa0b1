"""Stop requests of a foreground `gyre up` / `gyre demo`: SIGTERM and SIGINT only set an event.

    with StopSignals() as stop:
        state = up(config, stop=stop.event)
        stop.on_stop = lambda: down_state(state)      # runs on its own thread at the first signal
        while not stop.event.wait(1.0):
            ...

The handler itself does nothing but set `event` (an exception raised from a handler can land anywhere,
e.g. in the middle of a teardown, and abort it). `on_stop` — the teardown — runs on a thread of its own at
the first signal, so the stop is bounded whatever the main thread is blocked on (a long RPC, reading
events). A second signal exits at once with 128 + signum; the run's supervisor is tied to this process
(PR_SET_PDEATHSIG) and stops the run by itself. Outside the main thread no handler is installed.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Context manager turning SIGTERM/SIGINT into a stop request (see the module docstring)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.on_stop: Callable[[], None] | None = None
        self._stopper: threading.Thread | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.join()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            os._exit(128 + signum)
        self.signum = signum
        self.event.set()
        if self.on_stop is not None:
            self._stopper = threading.Thread(target=self.on_stop, name="stop", daemon=True)
            self._stopper.start()

    @property
    def teardown_started(self) -> bool:
        """A signal started `on_stop` (if a signal came before `on_stop` was set, run the teardown yourself)."""
        return self._stopper is not None

    def join(self) -> None:
        """Wait for a teardown started by a signal to finish."""
        if self._stopper is not None:
            self._stopper.join()

    @property
    def exit_code(self) -> int:
        """128 + the signal that stopped the run (the shell's convention)."""
        return 128 + (self.signum or 0)
