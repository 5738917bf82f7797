"""A real, small, full-able file system for the full-disk tests: a tmpfs of a few hundred KB
mounted with mount(2) (no subprocess, so unit tests may use it too). Mounting needs root with
CAP_SYS_ADMIN; where it is refused the test is skipped, naming why (``tiny_fs`` fixture in
tests/conftest.py, marker ``needs_mount``)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

MNT_DETACH = 2  # umount2: detach now even if a file is still open in it
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def mount_tmpfs(target: Path, size_bytes: int) -> None:
    """Mount a tmpfs of ``size_bytes`` (rounded up to pages) on the existing folder ``target``;
    OSError with the kernel's reason when mounting is not allowed here."""
    options = f"size={size_bytes},mode=0777".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def unmount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def fill(directory: Path, leave_bytes: int) -> None:
    """Take the space of ``directory``'s file system but about ``leave_bytes`` (a ballast file)."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    (directory / ".ballast").write_bytes(bytes(max(0, free - leave_bytes)))
