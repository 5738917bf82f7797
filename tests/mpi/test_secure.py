"""--secure under a real mpirun: the same training as the unmasked run, and flags it refuses."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.mpi import run_mpi

pytestmark = pytest.mark.mpi
TRAIN = ["-m", "mpifgl.train"]


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_secure_training_equals_the_unmasked_run(toy_shards, tmp_path):
    """3 clients, sampled steps, dropout, evaluation and --save-logits: losses and logits agree
    within the fixed-point bound (float64: far below 1e-9), scores are identical, bytes differ
    only by what carries the exponents: a head row per exchange each way, the gradient sum's
    histogram tail, and the first use's agreements (docs/privacy.md)."""
    from mpifgl.secure import HISTOGRAM_WORDS
    shards = toy_shards(3, seed=4)
    runs = {}
    for name, flags in (("plain", []), ("secure", ["--secure"])):
        runs[name] = tmp_path / name
        done = run_mpi(4, [*TRAIN, "--shards", str(shards), "--out", str(runs[name]),
                           "--epochs", "4", "--hidden", "16", "--sample-size", "30",
                           "--dtype", "float64", "--save-logits", *flags], timeout=140)
        assert done.returncode == 0, done.stderr[-3000:]
    plain, masked = metrics(runs["plain"]), metrics(runs["secure"])
    steps = json.loads((runs["secure"] / "config.json").read_text())["steps_per_epoch"]
    classes = json.loads((shards / "manifest.json").read_text())["num_classes"]
    segments = 2 * 2 + 1  # weight and bias of 2 layers, the loss
    head_words = 16 + classes  # one head row per exchange: layer 1 (hidden), layer 2 (classes)
    # per step: the gradient sum's tails, the head rows forward and backward; evaluation and
    # the first uses' agreements once
    exponent_bytes = (steps * (segments * HISTOGRAM_WORDS + 2 * head_words) + head_words
                      + 16) * 8
    for a, b in zip(plain, masked):
        assert abs(a["loss"] - b["loss"]) <= 1e-9 * max(1.0, abs(a["loss"]))
        assert "secure_redos" not in a and b["secure_redos"] in range(0, 4 * steps)
        for split in ("train", "val", "test"):
            assert a[f"{split}_micro_f1"] == b[f"{split}_micro_f1"]
        assert a["exchange_bytes_sent"][1:] != [] and all(
            y - x < 0.02 * x + exponent_bytes
            for x, y in zip(a["bytes_sent"][1:], b["bytes_sent"][1:]))
    logits_plain, logits_secure = (np.load(runs[n] / "logits.npy") for n in ("plain", "secure"))
    scale = max(1.0, float(np.abs(logits_plain).max()))
    assert np.max(np.abs(logits_plain - logits_secure)) <= 1e-9 * scale
    assert json.loads((runs["secure"] / "config.json").read_text())["secure"] is True


@pytest.mark.timeout(120)
def test_secure_with_a_reduce_exchange_is_refused_naming_both_flags(toy_shards, tmp_path):
    shards = toy_shards(2)
    done = run_mpi(3, [*TRAIN, "--shards", str(shards), "--out", str(tmp_path / "run"),
                       "--secure", "--exchange", "reduce"], timeout=100)
    assert done.returncode == 2
    assert "--secure with --exchange 'reduce': expected --exchange compact" in done.stderr
    assert not (tmp_path / "run").exists()
