"""SIGTERM/SIGINT during a foreground run only set an event and start the teardown on its own thread."""

from __future__ import annotations

import os
import signal
import threading

from app.stack.signals import StopSignals


def test_a_signal_sets_the_event_runs_the_teardown_once_and_the_old_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    teardowns: list[str] = []
    with StopSignals() as stop:
        stop.on_stop = lambda: teardowns.append(threading.current_thread().name)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.event.wait(5.0)
        stop.join()
        assert stop.teardown_started
    assert teardowns == ["stop"]  # on its own thread, not inside the handler
    assert stop.exit_code == 128 + signal.SIGTERM
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_signal_before_the_teardown_is_known_is_left_to_the_caller() -> None:
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.event.wait(5.0)
    assert not stop.teardown_started and stop.exit_code == 128 + signal.SIGINT
