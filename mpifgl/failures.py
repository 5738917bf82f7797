"""How a failure becomes one message a user understands. No MPI here (mpifgl.comm aborts).

Two kinds of failure, one rule each (docs/reliability.md):

* ``AgreedFailure``: every rank learned it at the same point, so every rank stops there
  together; rank 0 prints it once and every rank exits with status 1. ``SetupError`` (found at
  an agreement point, ``agree``) and ``mpifgl.finite.NonFiniteError`` (a NaN or an infinity in
  training) are the two kinds.
* anything else, on any rank, at any time after MPI starts (OSError, running out of memory, a
  bug, SIGINT/SIGTERM): that rank prints one line (``describe``) and aborts the whole job, so no
  rank is left waiting in a collective.

A rank that stops answering (frozen) is found by the watchdog (mpifgl.watchdog), which words its
line with ``describe_stall``.
"""
from __future__ import annotations

import errno
import re
import resource
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from mpifgl.communicator import SERVER_RANK, Communicator, client_of_rank
from mpifgl.watchdog import Stall

T = TypeVar("T")


class AgreedFailure(Exception):
    """A failure every rank raises at the same point: rank 0 reports it, no rank aborts."""


class SetupError(AgreedFailure):
    """A problem every rank learned at the same agreement point (``agree``)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM (Ctrl-C, scancel, a time limit): ends the run, keeps its files."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise Interrupted in the main thread."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """While a failure is reported, SIGINT and SIGTERM are ignored: a second signal (scancel
    signals every rank, the launcher signals the ranks left after an abort) must not turn the
    one line into tracebacks. The handlers come back after (one process goes on: a test).
    Python runs handlers in the main thread only, so a rank that is a thread (in-process tests)
    has nothing to ignore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, signal.SIG_IGN)
             for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def exit_status(exc: BaseException) -> int:
    """128 + signal number for an interrupt (the shell's convention), else 1."""
    return 128 + exc.signum if isinstance(exc, Interrupted) else 1


def describe(exc: BaseException, config: Any = None, one_process: bool = False) -> str:
    """One line for the user: the path and the OS's reason for I/O errors, what to change for
    memory errors (naming ``config``'s values when given), the message itself for our own
    errors, the exception type otherwise."""
    shortfall = memory_shortfall(exc)
    if shortfall is not None:
        return f"{shortfall}; {memory_advice(config, one_process)}"
    if isinstance(exc, OSError) and exc.strerror:
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        return f"{' -> '.join(paths) + ': ' if paths else ''}{exc.strerror}"
    if isinstance(exc, (AgreedFailure, ValueError)) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# What allocators say when memory runs out: torch's CPU allocator names the bytes, CUDA and numpy
# a rounded size; h5py, MPI and the OS say it in words
ALLOCATION_SIZES = (re.compile(r"tried to allocate (\d+) bytes"),
                    re.compile(r"(?:Tried to allocate|Unable to allocate) ([\d.]+ [KMGTPE]?i?B)"))
OUT_OF_MEMORY_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                       "not enough memory", "memory allocation failed")


def memory_shortfall(exc: BaseException) -> str | None:
    """'out of memory allocating 546.6 MiB (...)' when ``exc`` says memory ran out, whoever
    raised it (MemoryError, torch's RuntimeError, an OSError of ENOMEM, h5py, MPI); else None."""
    text = str(exc)
    if not (isinstance(exc, MemoryError)
            or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM)
            or (not isinstance(exc, AgreedFailure)
                and any(words in text.lower() for words in OUT_OF_MEMORY_WORDS))):
        return None
    size = None
    for pattern in ALLOCATION_SIZES:
        found = pattern.search(text)
        if found:
            size = found.group(1)
            size = human_bytes(int(size)) if size.isdigit() else size
            break
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    bound = (f" (this process may use {human_bytes(limit)} of address space: ulimit -v)"
             if limit != resource.RLIM_INFINITY else "")
    return f"out of memory{f' allocating {size}' if size else ''}{bound}"


def memory_advice(config: Any = None, one_process: bool = False) -> str:
    """What to change when memory runs out, with the values of ``config`` (a TrainConfig; None:
    every flag that sizes memory): the sample only where there is one, the exchange's buffers
    only where ranks exchange."""
    names = ["hidden"]
    if getattr(config, "sampling", "label") != "none":
        names.append("sample_size")
    if not one_process:
        names.append("exchange_buffer_mb")
    flags = [f"--{name.replace('_', '-')}" + (f" (now {getattr(config, name)})"
                                              if getattr(config, name, 0) else "")
             for name in names]  # --sample-size 0 is the default, resolved later
    smaller = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} or {flags[-1]}"
    more = ("more memory for this process" if one_process else
            "more memory for each rank (fewer ranks per node, or more nodes)")
    return f"use a smaller {smaller}, or {more}"


def human_bytes(count: float) -> str:
    """1.5 GiB, 546.6 MiB, 812 bytes."""
    for unit, size in (("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20),
                       ("KiB", 2 ** 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} bytes"


def describe_stall(stall: Stall, where: str) -> str:
    """The watchdog's line: how long no collective completed, where this rank is, which ranks
    did not answer and on which hosts."""
    silent = " and ".join(f"{rank_label(rank, client_of_rank(rank))} on host {host}"
                          for rank, host in zip(stall.silent, stall.hosts))
    waiting = f" ({stall.waiting_in})" if stall.waiting_in else ""
    return (f"no collective completed for {stall.waited:.0f} s {where}{waiting}: waiting for "
            f"{silent}, which {'has' if len(stall.silent) == 1 else 'have'} not answered within "
            f"{stall.answer_seconds:.0f} s (stopped, swapping, or its node lost)")


def agree(comm: Communicator, work: Callable[[], T], server_only: bool = False) -> T:
    """Run ``work`` on every rank, then share every rank's failure (one collective); if any rank
    failed, every rank raises the same SetupError. ``comm.agree_on_errors`` lists (rank, client
    id, message). ``server_only``: only the server does real work (the others return at once),
    so its finding concerns the whole job and is not labelled with its rank."""
    error = None
    result = None
    try:
        result = work()
    except Exception as exc:  # reported by every rank below, so all of them stop together
        error = describe(exc)
    errors = comm.agree_on_errors(error)
    if errors:
        messages = {message for _, _, message in errors}
        if len(messages) == 1 and (len(errors) > 1 or comm.size == 1 or server_only):
            raise SetupError(messages.pop())  # the same finding on every rank that failed
        raise SetupError("\n".join(f"{rank_label(rank, client, host_of(comm, rank))}: {message}"
                                   for rank, client, message in errors))
    return result  # type: ignore[return-value]


def rank_label(rank: int, client_id: int, host: str = "") -> str:
    """``server (rank 0)`` or ``client 2 (rank 3)``; with a host, ``client 2 (rank 3 on node2)``."""
    where = f"rank {rank} on {host}" if host else f"rank {rank}"
    return f"server ({where})" if rank == SERVER_RANK else f"client {client_id} ({where})"


def host_of(comm: Communicator, rank: int) -> str:
    """The host of ``rank`` where the job spans several hosts (messages name it), else ''."""
    return comm.hosts[rank] if len(set(comm.hosts)) > 1 else ""
