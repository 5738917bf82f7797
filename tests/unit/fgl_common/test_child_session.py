"""fgl_common.child_session without a child: an interrupt while a child starts is held, then
raised (tests/mpi/test_child_session.py ends real jobs)."""
from __future__ import annotations

import os
import signal
import time

from fgl_common.child_session import interrupts_held, session_members


def test_an_interrupt_while_starting_is_held_then_raised():
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # a Python handler would have run by now
            assert received == []
        time.sleep(0.05)
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_session_members_finds_this_process_and_skips_other_sessions():
    assert os.getpid() in session_members(os.getsid(0))
    assert session_members(2 ** 22 + 7) == []  # above any pid_max: no such session
