"""Who owns a lock or a temporary directory, and whether that owner is gone.

An owner is (host, pid, process start time). It is known to be dead only on the same host: the
pid no longer exists, or it now belongs to a process started at another time (pid reuse). An
owner on another host is never declared dead (docs/reliability.md: shared file systems).

Temporary directories of long jobs (data_prep's ``.partial-`` folders and raw copies) carry
their owner in their name, ``<prefix><host>-<pid>-<random>``, so the next run can remove those
of killed processes (``remove_dead_owners``) and leave those of live ones alone.

Plain standard library: no numpy, no torch, no MPI.
"""
from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any


def _start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks after boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # field 22; the command name (field 2) may hold spaces, so count from its closing ')'
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_owner() -> dict[str, Any]:
    """This process as the owner of a lock: host, pid, start ticks, wall-clock start."""
    owner: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(),
                             "start_ticks": _start_ticks(os.getpid()),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if os.environ.get("SLURM_JOB_ID"):
        owner["slurm_job"] = os.environ["SLURM_JOB_ID"]
    return owner


def owner_is_dead(host: str, pid: int, start_ticks: int | None = None) -> bool:
    """True only when certain: same host, and the pid is gone or belongs to a newer process."""
    if host != socket.gethostname() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return start_ticks is not None and _start_ticks(pid) not in (None, start_ticks)


def owner_tag() -> str:
    """``<host>-<pid>``, put into the names of temporary directories."""
    return f"{socket.gethostname()}-{os.getpid()}"


def tagged_owner(tagged: str) -> tuple[str, int] | None:
    """(host, pid) of a name part ``<host>-<pid>-<random>`` (``owner_tag`` plus a suffix
    without '-'), None where it is not of that form."""
    parts = tagged.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def remove_dead_owners(parent: Path, prefix: str) -> list[Path]:
    """Remove the entries ``<prefix><host>-<pid>-<random>`` of ``parent`` whose owner is dead
    (see ``owner_is_dead``); return what was removed. Unreadable folders are left alone."""
    removed = []
    try:
        entries = [p for p in Path(parent).iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        owner = tagged_owner(entry.name[len(prefix):])
        if owner is None:
            continue
        if owner_is_dead(*owner):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
