"""fgl_common.ownership: who owns a lock or a temporary directory, and when the owner is dead."""
from __future__ import annotations

import os
import socket

from fgl_common.ownership import owner_is_dead
from tests.helpers import dead_pid


def test_pid_reuse_counts_as_dead():
    assert not owner_is_dead(socket.gethostname(), os.getpid())
    assert owner_is_dead(socket.gethostname(), os.getpid(), start_ticks=-1)
    assert owner_is_dead(socket.gethostname(), dead_pid())
