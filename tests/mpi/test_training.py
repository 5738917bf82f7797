"""Real mpirun runs of the training program (2-4 ranks): reproducibility, checkpoints, outputs,
and failing loudly and together on bad input. Every test has a hard timeout."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.graphs import random_graph, random_parts, tamper_shard, write_shards
from tests.helpers.runs import run_ok
from tests.helpers.mpi import MPI_SCRIPTS, REPO, mpi_env, mpirun_path, rank_pids, run_mpi

TRAIN = ["-m", "mpifgl.train"]
QUICK = ["--epochs", "4", "--hidden", "16", "--sample-size", "30"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scores(run_dir: Path) -> list[tuple]:
    keys = ("epoch", "loss", "train_micro_f1", "val_micro_f1", "test_micro_f1")
    return [tuple(m.get(k) for k in keys) for m in metrics(run_dir)]


def same_weights(a: Path, b: Path) -> bool:
    first, second = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.timeout(180)
def test_run_directory_contents_and_reproducibility(toy_shards, tmp_path):
    shards = toy_shards(2)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run_ok(run_mpi(3, [*TRAIN, "--shards", str(shards), "--out", str(run), *QUICK,
                       "--save-logits", "--dtype", "float64"], timeout=120))
    a = runs[0]
    for name in ("config.json", "metrics.jsonl", "final.json", "model.pt", "logits.npy"):
        assert (a / name).is_file(), name
    rows = metrics(a)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    for key in ("loss", "train_micro_f1", "val_micro_f1", "test_micro_f1", "epoch_seconds",
                "compute_seconds", "comm_seconds", "bytes_sent", "bytes_received", "peak_rss_mb"):
        assert key in rows[0], key
    assert len(rows[0]["bytes_sent"]) == 3 and all(b > 0 for b in rows[0]["bytes_sent"])
    final = json.loads((a / "final.json").read_text())
    for key in ("test_micro_f1", "best_val_micro_f1", "best_epoch", "epochs", "num_clients",
                "algo", "dataset"):
        assert key in final, key
    assert final["num_clients"] == 2 and final["algo"] == "ours"
    best = max(rows, key=lambda r: (r["val_micro_f1"], -r["epoch"]))
    assert final["test_micro_f1"] == best["test_micro_f1"]
    logits = np.load(a / "logits.npy")
    assert logits.shape == (60, 3) and np.isfinite(logits).all()
    state = torch.load(a / "model.pt")
    assert sorted(state) == ["layers.0.bias", "layers.0.lin.weight", "layers.1.bias",
                             "layers.1.lin.weight"]
    layer_order = [int(key.split(".")[1]) for key in state]
    assert layer_order == sorted(layer_order)  # keys name the layers in order
    # Same seed, same shards, same ranks: identical losses, scores and weights.
    assert scores(runs[0]) == scores(runs[1])
    assert same_weights(runs[0], runs[1])
    assert np.array_equal(logits, np.load(runs[1] / "logits.npy"))


@pytest.mark.timeout(240)
def test_resume_matches_uninterrupted_run(toy_shards, tmp_path):
    shards = toy_shards(3)
    common = [*TRAIN, "--shards", str(shards), "--hidden", "16", "--sample-size", "30",
              "--checkpoint-every", "2", "--seed", "4"]
    whole, part, more = tmp_path / "whole", tmp_path / "part", tmp_path / "more"
    run_ok(run_mpi(4, [*common, "--out", str(whole), "--epochs", "6"], timeout=150))
    run_ok(run_mpi(4, [*common, "--out", str(part), "--epochs", "4"], timeout=150))
    assert (part / "checkpoint.pt").is_file()
    # a finished run is continued into a new directory, never rewritten
    run_ok(run_mpi(4, [*TRAIN, "--resume", str(part), "--out", str(more), "--epochs", "6"],
                   timeout=150))
    assert scores(more) == scores(whole)
    assert same_weights(more, whole)
    # The record of the resumed run is the uninterrupted one's (bytes, epochs, evaluations),
    # but for times and memory, its own identity and the parts it ran in
    own = ("wall_seconds", "mean_train_epoch_seconds", "train_seconds", "eval_seconds",
           "peak_rss_mb_per_rank", "rank_reports", "run_id", "resumed_from", "parts")
    final = {k: v for k, v in json.loads((more / "final.json").read_text()).items()
             if k not in own}
    assert final == {k: v for k, v in json.loads((whole / "final.json").read_text()).items()
                     if k not in own}
    assert final["epochs_run"] == 6 and sum(final["bytes_per_rank"]) > 0
    assert [r["epoch"] for r in metrics(part)] == [1, 2, 3, 4]
    # A resume may not change the math.
    bad = run_mpi(4, [*TRAIN, "--resume", str(part), "--out", str(tmp_path / "bad"), "--lr",
                      "0.5"], timeout=60)
    assert bad.returncode != 0 and "--lr 0.5" in bad.stderr


@pytest.mark.timeout(120)
def test_wrong_rank_count_fails_fast_with_one_message(toy_shards):
    shards = toy_shards(2)
    start = time.monotonic()
    done = run_mpi(4, [*TRAIN, "--shards", str(shards), "--out", "/tmp/never"], timeout=90)
    assert done.returncode != 0
    assert "world size 4 != 1 server + 2 clients" in done.stderr
    assert "mpirun -n 3" in done.stderr
    assert done.stderr.count("world size 4") == 1  # one message, from rank 0
    assert time.monotonic() - start < 60
    assert not Path("/tmp/never").exists()


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    path.write_bytes(bytes(data))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks,damage", [(3, "missing"), (5, "missing"), (3, "corrupted"),
                                          (3, "mismatched"), (3, "no-manifest"),
                                          (3, "non-finite"), (4, "other-partition")])
def test_bad_shards_end_every_rank_with_a_clear_message(toy_shards, tmp_path, ranks, damage):
    shards = toy_shards(ranks - 1)
    target = shards / "client_1.h5"
    if damage == "missing":
        target.unlink()
        expected = "client_1.h5: shard file missing"
    elif damage == "corrupted":
        _corrupt(target)
        expected = "client_1.h5: sha256"
    elif damage == "mismatched":
        # A valid shard of ANOTHER graph, with the manifest's checksum updated to hide it.
        other = write_shards(random_graph(n=50, seed=3), random_parts(50, ranks - 1),
                             tmp_path / "other")
        shutil.copy(other / "client_1.h5", target)
        manifest = json.loads((shards / "manifest.json").read_text())
        manifest["clients"][1]["sha256"] = json.loads(
            (other / "manifest.json").read_text())["clients"][1]["sha256"]
        (shards / "manifest.json").write_text(json.dumps(manifest))
        expected = "client_1.h5: "
    elif damage == "non-finite":  # one NaN in a feature, the checksum made consistent
        def one_nan(x):
            x[5, 3] = np.nan
            return x
        tamper_shard(shards, 1, x=one_nan)
        expected = "client_1.h5: /nodes/x holds non-finite values: nan at row 5 (global id "
    elif damage == "other-partition":  # a client file of another partition of the same graph
        other = write_shards(random_graph(n=60, avg_degree=5, d=7, classes=3, seed=11,
                                          isolated=2), random_parts(60, ranks - 1, seed=9),
                             tmp_path / "other")
        tamper_shard(shards, 1, source=other / "client_1.h5")
        expected = "the shards are not one partition of one graph"
    else:
        (shards / "manifest.json").unlink()
        expected = "manifest missing"
    done = run_mpi(ranks, [*TRAIN, "--shards", str(shards), "--out", str(tmp_path / "run"),
                           "--exchange", "reduce"], timeout=90)
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("mpifgl.train:") == 1, done.stderr[-2000:]  # once, by rank 0
    assert not (tmp_path / "run").exists()
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [3, 5])
def test_exception_on_one_rank_aborts_the_job(toy_shards, tmp_path, ranks):
    shards = toy_shards(ranks - 1)
    script = str(MPI_SCRIPTS / "raise_on_client.py")
    start = time.monotonic()
    done = run_mpi(ranks, [script, "--shards", str(shards), "--out", str(tmp_path / "run"),
                       "--epochs", "50"], timeout=90)
    assert done.returncode != 0
    assert "injected failure on client 1" in done.stderr + done.stdout
    assert time.monotonic() - start < 80


@pytest.mark.timeout(180)
def test_client_killed_with_sigkill_ends_the_job(toy_shards, tmp_path):
    shards = toy_shards(2)
    run = tmp_path / "killed-run"
    process = subprocess.Popen(
        [mpirun_path(), "-n", "3", sys.executable, *TRAIN, "--shards", str(shards), "--out",
         str(run), "--epochs", "100000", "--hidden", "16"],
        env=mpi_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        pids = rank_pids(str(run))
        assert 2 in pids, pids
        os.kill(pids[2], signal.SIGKILL)
        process.wait(timeout=60)  # the job must end by itself, not hang
        assert process.returncode != 0
        assert all(not Path(f"/proc/{pid}").exists() or
                   "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
                   for pid in pids.values())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
