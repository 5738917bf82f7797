"""mpifgl.failures: the one-line description of an error (path and OS reason)."""
from __future__ import annotations

import errno

from mpifgl.failures import SetupError, describe


def test_describe_names_the_path_and_the_os_reason():
    error = OSError(errno.ENOSPC, "No space left on device", "/runs/a/checkpoint.pt")
    assert describe(error) == "/runs/a/checkpoint.pt: No space left on device"
    assert describe(MemoryError()).startswith("out of memory")
    assert describe(SetupError("world size 4 != 3")) == "world size 4 != 3"
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"
