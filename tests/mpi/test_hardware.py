"""--device and --threads under mpirun: a GPU asked for on a machine without one stops every rank
at set-up with one line naming the flag; config.json records every rank's device and threads."""
from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.mpi import run_mpi


@pytest.mark.timeout(150)
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_stops_every_rank_with_one_line(toy_shards, tmp_path):
    out = tmp_path / "run"
    done = run_mpi(3, ["-m", "mpifgl.train", "--shards", str(toy_shards(2)), "--out", str(out),
                       "--epochs", "1", "--device", "cuda"], timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "--device cuda" in line]
    assert len(lines) == 1 and "torch sees no CUDA device" in lines[0], done.stderr[-2000:]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.timeout(150)
def test_config_records_every_ranks_device_and_threads(toy_shards, tmp_path):
    out = tmp_path / "run"
    done = run_mpi(3, ["-m", "mpifgl.train", "--shards", str(toy_shards(2)), "--out", str(out),
                       "--epochs", "1", "--hidden", "8", "--device", "cpu", "--threads", "1"],
                   timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config["devices"] == ["cpu"] * 3 and config["threads_per_rank"] == [1, 1, 1]
    assert config["device"] == "cpu" and config["threads"] == "1"
