"""Launch a command (``mpirun`` and its ranks, mostly) in a session of its own, wait for it with a
timeout, and end every process of that session when it times out or the caller is interrupted.

Why a session and not a process group: Open MPI's launcher puts each local rank in a process
group of its own, so ``killpg`` on mpirun's group ends mpirun and leaves the ranks running (they
go on writing into a run directory that the caller has removed or reuses). Every rank keeps
mpirun's session id, so the session is what is ended.

A SIGINT or SIGTERM that arrives while ``Popen`` is starting the child is held until ``Popen``
has returned: raised inside it, it would leave a running child that nobody knows the pid of.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
POLL_SECONDS = 0.2


@dataclass
class Finished:
    """How a child ended: its exit status (negative: the signal that killed it), whether it
    ran past its timeout (then it was ended), and its resource usage from ``wait4``."""

    returncode: int
    timed_out: bool
    rusage: Any = None

    @property
    def peak_rss_mb(self) -> float | None:
        """The largest resident set of the child or a descendant it waited for (Linux: KB)."""
        return None if self.rusage is None else self.rusage.ru_maxrss / 1024


@contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM are recorded, not acted on, inside; each is raised again on leaving.
    Handlers, not the signal mask, are swapped: a child inherits a blocked mask across exec,
    but a caught signal goes back to its default there. Outside the main thread (where no
    handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    saved = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum))
             for signum in INTERRUPTS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def process_state(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, session id)`` of a process from /proc/<pid>/stat; None if it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            after_name = stat.read().rsplit(b")", 1)[1].split()  # the name may hold spaces
    except (OSError, IndexError):
        return None
    return after_name[0].decode(), int(after_name[1]), int(after_name[3])  # state ppid pgrp sid


def is_live(state: tuple[str, int, int] | None) -> bool:
    """Running or sleeping: not gone, not a zombie (only its parent can reap that, and it holds
    nothing)."""
    return state is not None and state[0] not in ("Z", "X")


def session_members(session_id: int) -> list[int]:
    """The pids of every live process whose session id is ``session_id``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = process_state(int(entry))
            if is_live(state) and state[2] == session_id:
                members.append(int(entry))
    return members


def end_session(process: subprocess.Popen, grace: float = 10.0) -> int:
    """SIGTERM to the leader (mpirun passes it to its ranks, which report and end); after
    ``grace`` seconds SIGKILL to every process still in the session; returns once the leader
    is reaped and no member is left. Returns the leader's exit status."""
    session_id = process.pid
    try:
        process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        if process.returncode is not None and not session_members(session_id):
            return process.returncode
        time.sleep(POLL_SECONDS)
    kill_session(session_id)
    return process.wait()


def kill_session(session_id: int) -> None:
    """SIGKILL every process of the session until none is left."""
    while members := session_members(session_id):
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(POLL_SECONDS)


def run_in_session(command: Sequence[str], timeout: float, **popen_kwargs: Any) -> Finished:
    """Run ``command`` in a new session and wait up to ``timeout`` seconds. On timeout its
    session is ended (``Finished.timed_out``); on any exception here (Ctrl-C, SIGTERM turned
    into one by the caller) it is ended before the exception goes on. ``popen_kwargs`` go to
    ``Popen`` (env, cwd, stdout, stderr, preexec_fn)."""
    process = None
    try:
        with interrupts_held():
            process = subprocess.Popen(list(command), start_new_session=True, **popen_kwargs)
        deadline = time.monotonic() + timeout
        while True:
            pid, wait_status, rusage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(wait_status)
                kill_session(process.pid)  # mpirun gone, a rank not: none may outlive it
                return Finished(process.returncode, False, rusage)
            if time.monotonic() > deadline:
                return Finished(end_session(process), True)
            time.sleep(POLL_SECONDS)
    except BaseException:
        if process is not None:  # reaped already or not, nothing of its session is left
            end_session(process)
        raise
