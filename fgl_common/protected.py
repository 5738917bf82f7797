"""Run and shard directories belong to the program that wrote them: no other tool's output
replaces one of their files, and no tool writes a directory of its own into them.

* A **shard directory** (data_prep's ``--out``) holds ``manifest.json`` and the client files,
  nothing else: ``data_prep verify`` and training refuse anything more. No tool writes there,
  nor anywhere below it.
* A **run directory** (mpifgl.train's ``--out``) holds the run's files (``RUN_FILES``). A
  tool may add a file of its own there (``mpifgl.plot``'s ``metrics.png``, a bias report) and
  replace one it wrote before, recognised by its content (``is_own``), but never a file of the
  run's, and no directory of another program (a shard directory, a run) may go inside one.

Paths are compared resolved (symlinks and ``..`` followed), so another spelling of the same file
is refused alike. The checks read a few small files of the directories concerned: no shard file
is opened.

Plain standard library: no numpy, no torch, no MPI.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.json"
# what mpifgl.train writes into its run directory (the lock and temporary files are hidden)
RUN_OUTPUT_NAMES = (CONFIG_NAME, "metrics.jsonl", "final.json", "model.pt", "logits.npy",
                    "checkpoint.pt")
# what the study's driver writes there besides (study.runner)
STUDY_RUN_NAMES = ("command.txt", "stdout.log", "stderr.log", "driver.json", "FAILED.json")
RUN_FILES = RUN_OUTPUT_NAMES + STUDY_RUN_NAMES
SHARD_DIRECTORY = "shard directory"
RUN_DIRECTORY = "run directory"
_WRITER = {SHARD_DIRECTORY: "data_prep", RUN_DIRECTORY: "mpifgl.train"}


class ProtectedPathError(ValueError):
    """An output path that would replace or litter a run or shard directory."""


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def directory_kind(directory: str | os.PathLike) -> str | None:
    """``SHARD_DIRECTORY`` for data_prep's output (a manifest.json naming its clients),
    ``RUN_DIRECTORY`` for mpifgl.train's (a config.json of a run: its algo and world size,
    written at set-up before any epoch), None for anything else."""
    directory = Path(directory)
    manifest = directory / MANIFEST_NAME
    if manifest.is_file():
        record = _json_object(manifest)
        if record is not None and "clients" in record and "num_clients" in record:
            return SHARD_DIRECTORY
    config = directory / CONFIG_NAME
    if config.is_file():
        record = _json_object(config)
        if record is not None and "algo" in record and "world_size" in record:
            return RUN_DIRECTORY
    return None


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def _enclosing(path: Path, kinds: tuple[str, ...]) -> tuple[Path, str] | None:
    """The nearest directory above ``path`` of one of ``kinds``, with its kind."""
    for parent in path.parents:
        kind = directory_kind(parent)
        if kind in kinds:
            return parent, kind
    return None


def check_output_file(path: str | os.PathLike, flag: str,
                      is_own: Callable[[Path], bool] = lambda existing: False) -> None:
    """Raise ProtectedPathError when writing the file ``path`` (given as ``flag``) would put a
    file into a shard directory, or replace a file of a run directory that is not the tool's
    own (``is_own(existing)``: the tool recognises its earlier output)."""
    given = Path(path)
    for candidate in dict.fromkeys([_resolved(given.parent) / given.name, _resolved(given)]):
        inside = _enclosing(candidate, (SHARD_DIRECTORY,))
        if inside is not None:
            raise ProtectedPathError(
                f"{flag} {path}: refusing to write into the shard directory {inside[0]} (it "
                f"holds data_prep's manifest.json and client files only; `data_prep verify` "
                f"and training refuse anything else there); choose a path outside it")
        if directory_kind(candidate.parent) != RUN_DIRECTORY:
            continue
        if candidate.exists() and (candidate.name in RUN_FILES or candidate.name.startswith(".")
                                   or not candidate.is_file() or not is_own(candidate)):
            whose = ("a file of that run" if candidate.name in RUN_FILES
                     or candidate.name.startswith(".") else "not a file this tool wrote")
            raise ProtectedPathError(
                f"{flag} {path}: refusing to replace {candidate.name} in the run directory "
                f"{candidate.parent}: it is {whose}; choose a new file name")


def check_output_directory(path: str | os.PathLike, flag: str, own_kind: str | None) -> None:
    """Raise ProtectedPathError when the directory ``path`` (given as ``flag``), which a tool
    creates or writes a directory of ``own_kind`` into, is another program's run or shard
    directory, or lies inside one."""
    target = _resolved(path)
    kind = directory_kind(target) if target.is_dir() else None
    if kind is not None and kind != own_kind:
        raise ProtectedPathError(
            f"{flag} {path}: it is a {kind} of {_WRITER[kind]} "
            f"({MANIFEST_NAME if kind == SHARD_DIRECTORY else CONFIG_NAME} there); "
            f"{'a run directory' if own_kind == RUN_DIRECTORY else 'this output'} must not "
            f"replace or mix with it: choose a directory of its own")
    inside = _enclosing(target, (SHARD_DIRECTORY, RUN_DIRECTORY))
    if inside is not None:
        where, kind = inside
        raise ProtectedPathError(
            f"{flag} {path}: it lies inside the {kind} {where} of {_WRITER[kind]}, which holds "
            f"that program's files only; choose a directory outside it")
