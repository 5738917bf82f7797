"""mpifgl.failures: the one-line description of an error (path and OS reason, running out of
memory, a stalled job), and the signals ignored while one is reported."""
from __future__ import annotations

import errno
import os
import signal

import pytest

from mpifgl.failures import SetupError, agree, describe, describe_stall, rank_label, signals_ignored
from mpifgl.watchdog import Stall


def test_describe_names_the_path_and_the_os_reason():
    error = OSError(errno.ENOSPC, "No space left on device", "/runs/a/checkpoint.pt")
    assert describe(error) == "/runs/a/checkpoint.pt: No space left on device"
    assert describe(MemoryError()).startswith("out of memory")
    assert describe(SetupError("world size 4 != 3")) == "world size 4 != 3"
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"


def real_allocation_errors() -> dict[str, BaseException]:
    """What torch and numpy raise when an allocation fails (asked for far more than any
    address space holds), and what the OS and h5py say."""
    import numpy as np
    import torch
    found = {}
    for name, allocate in (("torch", lambda: torch.empty(1 << 50)),
                           ("numpy", lambda: np.empty((1 << 25, 1 << 25)))):
        try:
            allocate()
        except (RuntimeError, MemoryError) as exc:
            found[name] = exc
    found["os"] = OSError(errno.ENOMEM, "Cannot allocate memory")
    found["h5py"] = OSError("Can't read data (memory allocation failed for raw data chunk)")
    return found


def test_running_out_of_memory_says_how_much_and_what_to_change():
    from mpifgl.config import TrainConfig
    errors = real_allocation_errors()
    config = TrainConfig(hidden=100000, sample_size=500)
    advice = ("use a smaller --hidden (now 100000), --sample-size (now 500) or "
              "--exchange-buffer-mb (now 64.0), or more memory for each rank (fewer ranks per "
              "node, or more nodes)")
    assert "allocating 4.0 PiB" in describe(errors["torch"], config)  # 2^50 float32
    assert "allocating 8.00 PiB" in describe(errors["numpy"])  # numpy's own rounding
    for error in errors.values():
        line = describe(error, config)
        assert line.startswith("out of memory") and line.endswith(advice), line
    assert describe(MemoryError()).endswith(
        "use a smaller --hidden, --sample-size or --exchange-buffer-mb, or more memory for each "
        "rank (fewer ranks per node, or more nodes)")
    full_batch = TrainConfig(hidden=8, sampling="none")  # no sample, no exchange: the one knob
    assert describe(MemoryError(), full_batch, one_process=True) == (
        "out of memory; use a smaller --hidden (now 8), or more memory for this process")
    assert describe(SetupError("client 0 (rank 1): out of memory; use ...")) == \
        "client 0 (rank 1): out of memory; use ..."  # agreed: already worded


def test_a_stall_names_the_silent_ranks_and_their_hosts():
    stall = Stall(125.4, [2, 4], ["node1", "node2"], "MPI reduce on the world", 10.0)
    assert describe_stall(stall, "in epoch 5 of 30, step 2 of 4") == (
        "no collective completed for 125 s in epoch 5 of 30, step 2 of 4 (MPI reduce on the "
        "world): waiting for client 1 (rank 2) on host node1 and client 3 (rank 4) on host "
        "node2, which have not answered within 10 s (stopped, swapping, or its node lost)")
    busy = Stall(61.0, [0], ["node0"], None, 10.0)
    assert describe_stall(busy, "during set-up").startswith(
        "no collective completed for 61 s during set-up: waiting for server (rank 0) on host "
        "node0, which has not answered")


def test_signals_are_ignored_while_a_failure_is_reported():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with signals_ignored():
        os.kill(os.getpid(), signal.SIGTERM)  # would end pytest if it were not ignored
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert {s: signal.getsignal(s) for s in saved} == saved


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
