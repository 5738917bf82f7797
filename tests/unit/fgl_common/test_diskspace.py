"""fgl_common.diskspace: a write onto a full file system names the file, the free bytes and the
bytes it needed (a real tmpfs where one can be mounted; ENOSPC and EDQUOT faked besides)."""
from __future__ import annotations

import errno

import pytest

from fgl_common.diskspace import DiskFullError, explain_disk_full, is_disk_full, write_bytes


@pytest.mark.needs_mount
def test_a_write_onto_a_full_file_system_names_file_free_and_needed_bytes(tiny_fs):
    fs = tiny_fs(64 * 1024)
    with pytest.raises(DiskFullError) as caught:
        write_bytes(fs / "big.bin", bytes(200_000))
    message = str(caught.value)
    assert message.startswith(f"{fs / 'big.bin'}: No space left on device (the file system has ")
    assert "this write needs 200,000 bytes" in message
    assert caught.value.errno == errno.ENOSPC and caught.value.needed == 200_000
    write_bytes(fs / "small.bin", bytes(1000))  # what fits is written as usual
    assert (fs / "small.bin").stat().st_size == 1000


def test_quota_and_other_errors():
    with pytest.raises(DiskFullError, match=r"x\.json: Disk quota exceeded \(.*quota on it is "
                                            r"used up\)"):
        with explain_disk_full("/tmp/x.json", 10):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError):  # not a full disk: passed on untouched
        with explain_disk_full("/tmp/x.json"):
            raise PermissionError(errno.EACCES, "Permission denied")
    assert is_disk_full(OSError(errno.ENOSPC, "full")) and not is_disk_full(ValueError())
