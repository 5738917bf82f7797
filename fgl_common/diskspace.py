"""A write that meets a full file system (ENOSPC) or an exhausted quota (EDQUOT) ends with one
message naming the file, the bytes the file system had free and the bytes the write needed.

Every writer of the project (run files, checkpoints, metrics, logits, shards, manifests) wraps
its write in ``explain_disk_full``; the previous good file stays in place because the writers
write to a temporary name first (``mpifgl.runlog.atomic_write``, data_prep's scratch folder).

Plain standard library: no numpy, no torch, no MPI.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """ENOSPC or EDQUOT while writing ``filename``; ``strerror`` says how much space there was
    and how much the write needed, so ``str()`` and ``mpifgl.failures.describe`` show both."""

    needed: int | None = None  # bytes the write needed, where known

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (its
    nearest existing parent); None where that cannot be read."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def disk_full_error(path: str | os.PathLike, code: int, needed: int | None) -> DiskFullError:
    """The one message of a full file system: ``PATH: No space left on device (the file system
    has F bytes free, the write needs N bytes)``."""
    free = free_bytes(path)
    facts = [f"the file system has {free:,} bytes free" if free is not None
             else "free space unknown"]
    if needed is not None:
        facts.append(f"this write needs {needed:,} bytes")
    if code == errno.EDQUOT:
        facts.append("your quota on it is used up")
    error = DiskFullError(code, f"{os.strerror(code)} ({', '.join(facts)})", str(path))
    error.needed = needed
    return error


@contextmanager
def explain_disk_full(path: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Turn ENOSPC / EDQUOT raised inside the block into ``DiskFullError`` for ``path`` (the file
    the user knows, not a temporary name). ``needed``: the bytes the write needs, if known."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full_error(path, exc.errno, needed) from None


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed into
    place: a failure (a full disk, named) leaves no partial file and the old ``path`` intact."""
    path = Path(path)
    with explain_disk_full(path, len(data)):  # outside: free space is measured without the temp
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


__all__ = ["DISK_FULL_ERRNOS", "DiskFullError", "is_disk_full", "free_bytes", "disk_full_error",
           "explain_disk_full", "write_bytes"]
