"""Training runs started as programs (``python -m mpifgl.train``): the flags of a tiny run and
the checks of the run directory every method writes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from tests.helpers.thread_comm import ThreadWorld

TRAIN = ["-m", "mpifgl.train"]
TINY = ["--hidden", "8", "--log-every", "100", "--save-logits", "--force"]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def check_run_dir(run: Path, num_nodes: int, num_classes: int, epochs: int) -> dict:
    """The run directory every algorithm writes, with the same keys as `ours`."""
    for name in ("config.json", "metrics.jsonl", "final.json", "model.pt", "logits.npy"):
        assert (run / name).is_file(), f"{run / name} missing"
    records = metrics(run)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    for key in ("loss", "train_micro_f1", "val_micro_f1", "test_micro_f1", "epoch_seconds",
                "bytes_sent", "per_rank"):
        assert key in records[-1], key
    assert np.isfinite([r["loss"] for r in records]).all()
    logits = np.load(run / "logits.npy")
    assert logits.shape == (num_nodes, num_classes)
    assert np.isfinite(logits).all()
    final = json.loads((run / "final.json").read_text())
    assert 0.0 <= final["test_micro_f1"] <= 1.0
    return torch.load(run / "model.pt")


def run_ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``done`` if the program exited 0; else fail showing the end of its output."""
    assert done.returncode == 0, \
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def threaded_program(argv: list, ranks: int) -> list[int]:
    """``mpirun -n RANKS python -m mpifgl.train ARGV`` with the ranks as threads: every rank's
    exit status."""
    from mpifgl import train
    from mpifgl.methods import get_method
    argv = [str(a) for a in argv]
    config = train.parse_args(argv, quiet=True)
    explicit = train.explicit_dests(train.build_parser(), argv)
    config = get_method(config.algo).with_defaults(config, explicit)
    config.check_method_settings()

    def body(comm):
        progress = train.RankProgress(config)
        return train.run_rank(comm, progress, lambda: train.train(config, comm, progress,
                                                                  explicit))

    return ThreadWorld(ranks).run(body)
