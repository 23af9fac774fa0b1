"""A SIGTERM during a demo unwinds like Ctrl-C (the `finally` that brings the stack down runs)."""

from __future__ import annotations

import os
import signal

import pytest

from gyre.demo.run import _terminate_as_exit


def test_sigterm_raises_system_exit_inside_and_the_old_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    unwound = []
    with pytest.raises(SystemExit) as info, _terminate_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            unwound.append(True)
    assert info.value.code == 128 + signal.SIGTERM and unwound == [True]
    assert signal.getsignal(signal.SIGTERM) == before
