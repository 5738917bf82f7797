"""Training runs started as programs (``python -m mpifgl.train``): the flags of a tiny run and
the checks of the run directory every method writes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from tests.helpers.mpi import run_mpi, run_python
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
    config = config.replace(**get_method(config.algo).default_changes(explicit, config.layers))
    config.check_method_settings()

    def body(comm):
        progress = train.RankProgress(config)
        return train.run_rank(comm, progress, lambda: train.train(config, comm, progress,
                                                                  explicit))

    return ThreadWorld(ranks).run(body)


def fedavg_one_client_equals_centralized(graph, shard_dir: Path, tmp_path: Path,
                                         launch=run_mpi) -> None:
    """FedAvg's one client (one local epoch a round) trains as centralized full batch does:
    scores, weights and logits to 1e-10 in float64; ``launch`` runs the 2-rank job (default:
    ``mpirun`` on this host)."""
    common = ["--shards", str(shard_dir), "--epochs", "5", "--dtype", "float64",
              "--dropout", "0", "--local-epochs", "1", *TINY]
    run_ok(launch(2, TRAIN + common + ["--algo", "fedavg", "--out", str(tmp_path / "fedavg")],
                  timeout=240))
    run_ok(run_python(TRAIN + common + ["--algo", "centralized", "--sampling", "none",
                                        "--out", str(tmp_path / "central")], timeout=240))
    weights = check_run_dir(tmp_path / "fedavg", graph.num_nodes, graph.num_classes, 5)
    reference = torch.load(tmp_path / "central" / "model.pt")
    fedavg, central = metrics(tmp_path / "fedavg"), metrics(tmp_path / "central")
    for key in ("loss", "train_micro_f1", "test_micro_f1"):
        assert np.allclose([r[key] for r in fedavg], [r[key] for r in central], atol=1e-10), key
    assert weights.keys() == reference.keys()
    for name in weights:
        assert torch.allclose(weights[name], reference[name], atol=1e-10, rtol=0), name
    assert np.allclose(np.load(tmp_path / "fedavg" / "logits.npy"),
                       np.load(tmp_path / "central" / "logits.npy"), atol=1e-10)
