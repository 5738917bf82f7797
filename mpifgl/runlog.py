"""The run directory: what a run leaves behind, written by the server only.

    config.json     resolved configuration
    metrics.jsonl   one JSON object per epoch
    final.json      summary (test micro-F1 at the best validation epoch, ...)
    model.pt        plain state_dict of the final model (keys name the layers in order)
    logits.npy      [num_nodes, num_classes] in global node order (--save-logits)
    checkpoint.pt   last checkpoint (--checkpoint-every), written atomically
    .lock           held while a run uses the directory (host, pid, start; see RunLock)

Every file is written to a temporary name in the same directory, flushed to disk, renamed into
place and the directory flushed too, so a crash or a failed write leaves the previous good
version; metrics.jsonl is appended to, and a line that does not fit is cut off again. A full
file system is named with its free bytes and the bytes the write needed
(``fgl_common.diskspace``). The temporary files of a killed run (``.NAME.*.tmp``) are removed by
the next run that takes the directory. All run files get the same mode (0666 less the umask).
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import pickle
import re
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from fgl_common.diskspace import explain_disk_full
from fgl_common.ownership import owner_is_dead, owner_tag, tagged_owner, this_owner
from fgl_common.protected import (RUN_DIRECTORY, RUN_OUTPUT_NAMES, ProtectedPathError,
                                  check_output_directory)

CHECKPOINT_NAME = "checkpoint.pt"
LOCK_NAME = ".lock"
# the owner record a run links to LOCK_NAME: ``.lock.<host>-<pid>-<random>.tmp``; it exists
# before the lock is taken, so only a record of a dead process is a leftover
LOCK_RECORD_PREFIX = LOCK_NAME + "."
OUTPUT_NAMES = RUN_OUTPUT_NAMES  # one list, shared with the tools that must not replace them
assert CHECKPOINT_NAME in OUTPUT_NAMES
# What a checkpoint or model.pt may hold: what torch.load(weights_only=True) reads back, so that
# loading one never runs code (docs/reliability.md)
PLAIN_TYPES = (str, int, float, bool, type(None))


class RunDirError(ValueError):
    """The run directory cannot be used (taken, holds another run, cannot be created)."""


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new entry in ``directory`` durable (no-op where unsupported)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(handle)


def atomic_write(path: Path, write: Callable[[str], None], needed: int | None = None) -> None:
    """Call ``write(tmp_path)``, flush the file to disk, rename it onto ``path`` and flush the
    directory. On any failure the temp file is removed and ``path`` keeps its old content; a full
    file system is reported for ``path`` with the ``needed`` bytes (``DiskFullError``)."""
    with explain_disk_full(path, needed):  # outside: free space is measured without the temp
        _atomic_write(Path(path), write)


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, file_mode())
        os.close(handle)
        handle = -1
        write(tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        if handle >= 0:
            os.close(handle)
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


class RunLock:
    """``RUN/.lock``: taken by exactly one run, before it writes anything, for its whole life.

    Taking it: the owner record (host, pid, start time, SLURM job) is written to a temp file
    and hard-linked to ``.lock`` (atomic and exclusive, also on NFS), then held with ``flock``
    where the file system supports it. An existing lock is stale, and removed, only when its
    owner is certainly dead (same host, pid gone or reused: ``fgl_common.ownership``) and nobody
    holds its flock. A lock from another host is never broken automatically: the refusal names
    it and says how to remove it (docs/reliability.md)."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_NAME
        self.handle: int | None = None

    def acquire(self) -> None:
        record = json.dumps(this_owner(), sort_keys=True) + "\n"
        for _ in range(3):  # after removing a stale lock, link again
            handle, tmp = tempfile.mkstemp(prefix=f"{LOCK_RECORD_PREFIX}{owner_tag()}-",
                                           suffix=".tmp", dir=self.path.parent)
            try:
                os.fchmod(handle, file_mode())
                os.write(handle, record.encode())
                os.fsync(handle)
                os.link(tmp, self.path)
            except FileExistsError:
                self._remove_if_stale()
                continue
            finally:
                os.close(handle)
                Path(tmp).unlink(missing_ok=True)
            self.handle = os.open(self.path, os.O_RDONLY)
            _flock(self.handle, blocking=True)
            fsync_directory(self.path.parent)
            return
        raise RunDirError(f"{self.path}: could not take the lock: another run took it again "
                          f"each time a stale one was removed")

    def _remove_if_stale(self) -> None:
        try:
            handle = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # released meanwhile: link again
        try:
            try:
                owner = json.loads(os.read(handle, 1 << 16).decode())
            except ValueError:
                owner = {}
            dead = owner_is_dead(str(owner.get("host", "")), int(owner.get("pid", -1)),
                                 owner.get("start_ticks"))
            # still the same file (not a fresh lock linked meanwhile), and nobody flocks it
            if dead and _flock(handle, blocking=False) and \
                    os.fstat(handle).st_ino == _inode(self.path):
                self.path.unlink(missing_ok=True)
                return
        finally:
            os.close(handle)
        if dead:
            return  # replaced meanwhile: look again
        who = (f"pid {owner.get('pid')} on host {owner.get('host')}, started "
               f"{owner.get('started')}" + (f", SLURM job {owner['slurm_job']}"
                                            if owner.get("slurm_job") else "")
               if owner else "its lock file is unreadable")
        local = owner.get("host") == this_owner()["host"]
        advice = ("" if local else f". If that run has ended (it ran on another host, so this "
                  f"cannot be checked here), remove {self.path} and start again")
        raise RunDirError(f"--out {self.path.parent} is in use by another run ({who}){advice}")

    def release(self) -> None:
        if self.handle is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.handle)
        self.handle = None


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _flock(handle: int, blocking: bool) -> bool:
    """Take an exclusive flock; False if another process holds one. True where the file
    system has no flock (NFS without lock support): the pid check then decides alone."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError as exc:
        return exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)
    return True


def default_run_dir(dataset: str, algo: str) -> Path:
    """``runs/<dataset>-<algo>-<date>-<time>.<microseconds>-<SLURM job or pid>``: two runs
    started in the same second (array tasks) get different names; ``claim_run_dir(...,
    exclusive=True)`` refuses a name that exists anyway."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    job = os.environ.get("SLURM_JOB_ID")
    owner = (f"j{job}" + (f"_{os.environ['SLURM_ARRAY_TASK_ID']}"
                          if os.environ.get("SLURM_ARRAY_TASK_ID") else "")
             if job else f"p{os.getpid()}")
    return Path("runs") / f"{dataset}-{algo}-{stamp}-{owner}"


def remove_leftovers(directory: Path) -> list[str]:
    """Remove the temporary files of interrupted writes (``.NAME.*.tmp``: ``atomic_write``,
    whose writers held the lock this process holds now, so none of them is alive; and the lock
    owner records of dead processes) from a run directory. Returns the names removed."""
    removed = []
    for entry in sorted(Path(directory).iterdir()):
        if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.is_file():
            if entry.name.startswith(LOCK_RECORD_PREFIX) and not _lock_record_is_dead(entry.name):
                continue  # another run, starting at this moment, is about to try the lock
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def _lock_record_is_dead(name: str) -> bool:
    """Whether the process that wrote the owner record ``name`` is gone (``owner_is_dead``);
    a record named in the older ``.lock.<random>.tmp`` form carries no owner: dead."""
    owner = tagged_owner(name[len(LOCK_RECORD_PREFIX):-len(".tmp")])
    return owner is None or owner_is_dead(*owner)


def claim_run_dir(run_dir: str | os.PathLike, force: bool, resume: bool,
                  exclusive: bool = False) -> "RunDirectory":
    """Create (or open) the run directory and take its lock, before anything is written; then
    remove the temporary files a killed run left there.

    Raises RunDirError naming the path and the reason: it cannot be created (the OS's reason),
    another run holds it, or it holds an earlier run and neither --force nor ``resume`` (the
    run continues in its own directory) is given. ``exclusive``: the directory must not exist
    yet (default run directory names)."""
    path = Path(os.path.abspath(run_dir))
    flag = "--resume" if resume else "--out"
    try:  # never into a shard directory, nor inside another program's directory
        check_output_directory(path, flag, RUN_DIRECTORY)
    except ProtectedPathError as exc:
        raise RunDirError(str(exc)) from None
    created = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
            created = True
        except FileExistsError:
            if exclusive or not path.is_dir():
                raise
        fsync_directory(path.parent)
        lock = RunLock(path)
        lock.acquire()
    except RunDirError:
        raise
    except OSError as exc:
        if created:
            try:
                path.rmdir()
            except OSError:
                pass  # another run's files are in it already: theirs to keep
        culprit = Path(exc.filename) if exc.filename else path
        if isinstance(exc, FileExistsError) and not culprit.is_dir():
            reason = f"{culprit} is a file, not a directory"
        else:
            reason = f"{exc.strerror or exc}: {culprit}"
        raise RunDirError(f"{flag} {path}: cannot create the run directory ({reason})") from None
    leftovers = remove_leftovers(path)
    existing = [name for name in OUTPUT_NAMES if (path / name).exists()]
    if existing and not (force or resume):
        lock.release()
        raise RunDirError(f"--out {path} already holds a run ({', '.join(existing)}); choose a "
                          f"new directory, pass --force to overwrite, or --resume {path}")
    return RunDirectory(path, lock, created, leftovers)


class RunDirectory:
    """A claimed run directory (``claim_run_dir``); ``release()`` when the run ends."""

    def __init__(self, path: str | os.PathLike, lock: RunLock | None = None,
                 created: bool = False, leftovers: list[str] | None = None):
        self.path = Path(path)
        self.lock = lock
        self.created = created  # by this run: removed again by abandon() while still empty
        self.leftovers = leftovers or []  # temporary files of a killed run, removed at claim
        self.written: set[str] = set()  # files this run wrote

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def abandon(self) -> None:
        """Release after a run that never started training: a directory this run created goes
        again, with the files this run wrote into it (config.json), unless something else is
        there."""
        self.release()
        if not self.created:
            return
        for name in self.written:
            (self.path / name).unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:
            pass  # not empty: keep what is there

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        atomic_write(self.path / name, lambda tmp: Path(tmp).write_bytes(data), len(data))
        self.written.add(name)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One line per epoch, appended and flushed to disk; a line that does not fit (full
        disk) is cut off again, so the file keeps only whole lines."""
        path = self.path / "metrics.jsonl"
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with explain_disk_full(path, len(line)):
            handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                start = os.fstat(handle).st_size
                try:
                    _write_all(handle, line)
                    os.fsync(handle)
                except BaseException:
                    os.ftruncate(handle, start)
                    raise
            finally:
                os.close(handle)
        self.written.add("metrics.jsonl")

    def start_fresh(self) -> None:
        """A new run in this directory (--force): no line or file of an earlier run may stay
        behind to be mistaken for this one's (metrics.jsonl used to be appended to)."""
        for name in OUTPUT_NAMES:
            (self.path / name).unlink(missing_ok=True)

    def reset_metrics(self, keep_through_epoch: int = 0,
                      source: str | os.PathLike | None = None) -> None:
        """metrics.jsonl holds only the lines of epochs <= keep_through_epoch (resume), written
        atomically; ``source``: a run directory to take the lines from (a resume into a new
        directory), else this one."""
        path = Path(source or self.path) / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if line.strip()
                and json.loads(line).get("epoch", 0) <= keep_through_epoch]
        data = "".join(line + "\n" for line in kept).encode()
        atomic_write(self.path / "metrics.jsonl", lambda tmp: Path(tmp).write_bytes(data),
                     len(data))
        self.written.add("metrics.jsonl")

    def save_torch(self, name: str, payload: Any) -> None:
        """torch.save, serialised in memory first: the write then knows its size, and a full
        disk is an OSError naming the file (torch's own writer reports only a position)."""
        check_loadable(payload, name)
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        data = buffer.getbuffer()
        atomic_write(self.path / name, lambda tmp: Path(tmp).write_bytes(data), data.nbytes)
        self.written.add(name)

    def save_logits(self, logits: np.ndarray) -> None:
        """``np.save``'s format, written through Python's file object: numpy's own writer
        reports a full disk without its errno ("N requested and M written")."""
        logits = np.ascontiguousarray(logits)

        def write(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                np.lib.format.write_array_header_1_0(
                    handle, np.lib.format.header_data_from_array_1_0(logits))
                if logits.size:  # a view of no bytes cannot be cast
                    handle.write(memoryview(logits).cast("B"))
        atomic_write(self.path / "logits.npy", write, npy_bytes(logits))
        self.written.add("logits.npy")


def _write_all(handle: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view):]


def npy_bytes(array: np.ndarray) -> int:
    """The size of ``np.save(array)``'s file: its header, then the data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.tell() + array.nbytes


def new_run_id() -> str:
    """The identity of a run, made when its directory is started (config.json, final.json and
    every checkpoint carry it): a checkpoint of another run is told apart."""
    return secrets.token_hex(8)


def check_loadable(value: Any, where: str) -> None:
    """TypeError naming the entry when ``value`` holds anything but tensors, plain numbers,
    strings, None, and lists, tuples and dicts of them: what ``torch.load(weights_only=True)``
    reads back (a numpy array or a Python object would need code run to rebuild it)."""
    if type(value) in PLAIN_TYPES or isinstance(value, torch.Tensor):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_loadable(key, f"{where}: a key")
            check_loadable(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple):
        for k, item in enumerate(value):
            check_loadable(item, f"{where}[{k}]")
        return
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}: a "
                    f"checkpoint holds only tensors, numbers, strings, None, lists, tuples and "
                    f"dicts (what torch.load(weights_only=True) reads back)")


def load_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint of ``run_dir``, read with ``weights_only=True``: a file holding anything
    else than what mpifgl.train writes (``check_loadable``) is refused, never unpickled."""
    path = Path(run_dir) / CHECKPOINT_NAME
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # weights_only refused an object (never built)
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(exc))))
        what = f"the Python object {', '.join(found)}" if found else "an object"
        raise ValueError(f"{path}: refused: it holds {what}, which only running code could "
                         f"rebuild; a checkpoint of mpifgl.train holds tensors, numbers, "
                         f"strings, lists and dicts only, so this file was not written by it "
                         f"(or was altered)") from None
    except Exception as exc:  # a damaged file must name itself, not show torch's internals
        raise ValueError(f"{path}: checkpoint unreadable ({exc})") from None
    if not isinstance(payload, dict) or "epoch" not in payload:
        raise ValueError(f"{path}: not a checkpoint of mpifgl.train (expected a dict with its "
                         f"epoch, found {type(payload).__name__})")
    return payload
