"""How a failure becomes one message a user understands. No MPI here (mpifgl.comm aborts).

Two kinds of failure, one rule each (docs/reliability.md):

* ``AgreedFailure``: every rank learned it at the same point, so every rank stops there
  together; rank 0 prints it once and every rank exits with status 1. ``SetupError`` (found at
  an agreement point, ``agree``) and ``mpifgl.finite.NonFiniteError`` (a NaN or an infinity in
  training) are the two kinds.
* anything else, on any rank, at any time after MPI starts (OSError, MemoryError, a bug,
  SIGINT/SIGTERM): that rank prints one line (``describe``) and aborts the whole job, so no
  rank is left waiting in a collective.
"""
from __future__ import annotations

import signal
from typing import Any, Callable, TypeVar

from mpifgl.communicator import SERVER_RANK, Communicator

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


def exit_status(exc: BaseException) -> int:
    """128 + signal number for an interrupt (the shell's convention), else 1."""
    return 128 + exc.signum if isinstance(exc, Interrupted) else 1


def describe(exc: BaseException) -> str:
    """One line for the user: the path and the OS's reason for I/O errors, what to change for
    memory errors, the message itself for our own errors, the exception type otherwise."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        return f"{' -> '.join(paths) + ': ' if paths else ''}{exc.strerror}"
    if isinstance(exc, MemoryError):
        return ("out of memory" + (f" ({exc})" if str(exc) else "") + "; use more nodes, "
                "fewer ranks per node, or a smaller --hidden / --sample-size")
    if isinstance(exc, (AgreedFailure, ValueError)) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


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
