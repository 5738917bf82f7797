"""mpifgl.failures: the one-line description of an error (path and OS reason)."""
from __future__ import annotations

import errno

import pytest

from mpifgl.failures import SetupError, agree, describe, rank_label


def test_describe_names_the_path_and_the_os_reason():
    error = OSError(errno.ENOSPC, "No space left on device", "/runs/a/checkpoint.pt")
    assert describe(error) == "/runs/a/checkpoint.pt: No space left on device"
    assert describe(MemoryError()).startswith("out of memory")
    assert describe(SetupError("world size 4 != 3")) == "world size 4 != 3"
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"


class TwoHostWorld:
    """What ``agree`` reads of a communicator: three ranks on two hosts; client 1 (rank 2)
    failed."""

    size = 3
    hosts = ["node1", "node1", "node2"]

    def agree_on_errors(self, error):
        return [(2, 1, "/shards/client_1.h5: No such file or directory")]


def test_an_agreed_error_names_the_host_of_the_failing_rank_when_there_are_several():
    with pytest.raises(SetupError) as found:
        agree(TwoHostWorld(), lambda: None)
    assert str(found.value) == ("client 1 (rank 2 on node2): /shards/client_1.h5: No such file "
                                "or directory")
    one_host = TwoHostWorld()
    one_host.hosts = ["node1"] * 3
    with pytest.raises(SetupError, match=r"^client 1 \(rank 2\): /shards"):
        agree(one_host, lambda: None)
    assert rank_label(0, -1, "node1") == "server (rank 0 on node1)"
