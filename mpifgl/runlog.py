"""The run directory: what a run leaves behind, written by the server only.

    config.json     resolved configuration
    metrics.jsonl   one JSON object per epoch
    final.json      summary (test micro-F1 at the best validation epoch, ...)
    model.pt        plain state_dict of the final model (keys name the layers in order)
    logits.npy      [num_nodes, num_classes] in global node order (--save-logits)
    checkpoint.pt   last checkpoint (--checkpoint-every), written atomically

Every file is written to a temporary name in the same directory and renamed into place, so a
crash leaves the previous good version.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

CHECKPOINT_NAME = "checkpoint.pt"
OUTPUT_NAMES = ("config.json", "metrics.jsonl", "final.json", "model.pt", "logits.npy",
                CHECKPOINT_NAME)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``; the temp file is removed on failure."""
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_run_dir_writable(run_dir: str | os.PathLike, force: bool, resume: bool) -> str | None:
    """Why ``run_dir`` cannot be used, or None. Never loses an earlier run's files."""
    path = Path(run_dir)
    if resume:
        if not (path / CHECKPOINT_NAME).is_file():
            return (f"--resume {path}: no {CHECKPOINT_NAME} there (run with --checkpoint-every K "
                    f"to write one)")
        return None
    if path.exists() and not path.is_dir():
        return f"--out {path} exists and is not a directory"
    existing = [name for name in OUTPUT_NAMES if (path / name).exists()]
    if existing and not force:
        return (f"--out {path} already holds a run ({', '.join(existing)}); choose a new "
                f"directory, pass --force to overwrite, or --resume {path}")
    parent = path if path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        return f"--out {path}: directory {parent} is not writable"
    return None


class RunDirectory:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        atomic_write(self.path / name, lambda tmp: Path(tmp).write_text(text))

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def start_fresh(self) -> None:
        """A new run in this directory (--force): no line or file of an earlier run may stay
        behind to be mistaken for this one's (metrics.jsonl used to be appended to)."""
        for name in OUTPUT_NAMES:
            (self.path / name).unlink(missing_ok=True)

    def reset_metrics(self, keep_through_epoch: int = 0) -> None:
        """Keep only the lines of epochs <= keep_through_epoch (resume), atomically."""
        path = self.path / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if line.strip()
                and json.loads(line).get("epoch", 0) <= keep_through_epoch]
        text = "".join(line + "\n" for line in kept)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    def save_torch(self, name: str, payload: Any) -> None:
        atomic_write(self.path / name, lambda tmp: torch.save(payload, tmp))

    def save_logits(self, logits: np.ndarray) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                np.save(handle, logits)
        atomic_write(self.path / "logits.npy", write)


def load_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / CHECKPOINT_NAME
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a damaged file must name itself, not show torch's internals
        raise ValueError(f"{path}: checkpoint unreadable ({exc})") from None
