"""--device cuda (tests/gpu; skipped where torch sees no GPU). Every rank is a process under a
real mpirun, as in a run: distributed on CUDA equals centralized on the CPU and PyG (1e-10
float64, 1e-5 float32, relative to the largest value; full graph and a fixed sample, GCN and
1-GNN), in every exchange mode with one-row chunks, with --secure, and with a client that has no
cross edge; every --algo trains on CUDA; a run trained on CUDA records its GPU, its model.pt
loads without one, and it resumes on the CPU and back."""
from __future__ import annotations

import json

import pytest
import torch

from mpifgl.registry import EXCHANGES, METHODS
from tests.helpers.exactness import (TINY_MB, check_against_references, run_probe,
                                     two_islands_graph)
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import run_mpi, run_python


def shards(graph, tmp_path, clients: int, parts=None):
    parts = random_parts(graph.num_nodes, clients, seed=4) if parts is None else parts
    return write_shards(graph, parts, tmp_path / f"shards-{clients}")


@pytest.mark.timeout(300)
def test_cuda_distributed_equals_cpu_centralized_and_pyg(toy_graph, tmp_path):
    shard_dir = shards(toy_graph, tmp_path, 3)
    run_probe(shard_dir, tmp_path / "cuda.npz", 4, 3, device="cuda")
    check_against_references(toy_graph, shard_dir, 3, tmp_path / "cuda.npz")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(EXCHANGES))
def test_every_exchange_mode_on_cuda_in_one_row_chunks(toy_graph, tmp_path, mode):
    shard_dir = shards(toy_graph, tmp_path, 3)
    run_probe(shard_dir, tmp_path / "probe.npz", 4, 2, mode, TINY_MB, device="cuda")
    check_against_references(toy_graph, shard_dir, 2, tmp_path / "probe.npz")


@pytest.mark.timeout(300)
def test_secure_on_cuda_equals_centralized(toy_graph, tmp_path):
    shard_dir = shards(toy_graph, tmp_path, 3)
    run_probe(shard_dir, tmp_path / "secure.npz", 4, 2, device="cuda", secure=True)
    check_against_references(toy_graph, shard_dir, 2, tmp_path / "secure.npz")


@pytest.mark.timeout(300)
def test_a_client_with_no_cross_edge_on_cuda(tmp_path):
    graph, parts = two_islands_graph()
    shard_dir = shards(graph, tmp_path, 3, parts)
    run_probe(shard_dir, tmp_path / "islands.npz", 4, 2, device="cuda")
    check_against_references(graph, shard_dir, 2, tmp_path / "islands.npz")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", list(METHODS))
def test_every_algo_trains_on_cuda(toy_graph, tmp_path, algo):
    method = METHODS[algo]
    shard_dir = shards(toy_graph, tmp_path, 2)
    out = tmp_path / algo
    args = ["-m", "mpifgl.train", "--algo", algo, "--shards", str(shard_dir), "--out", str(out),
            "--epochs", "2", "--hidden", "16", "--batch-size", "16", "--fanouts", "4,3",
            "--device", "cuda"]
    done = run_mpi(3, args, timeout=240) if method.distributed else run_python(args, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert set(config["devices"]) == {"cuda:0"}, config["devices"]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in lines) and "peak_gpu_mb" in lines[-1]


@pytest.mark.timeout(600)
def test_a_cuda_run_records_its_gpu_and_resumes_on_the_cpu_and_back(toy_graph, tmp_path):
    shard_dir = shards(toy_graph, tmp_path, 2)
    out = tmp_path / "run"
    flags = ["-m", "mpifgl.train", "--shards", str(shard_dir), "--hidden", "16",
             "--checkpoint-every", "1"]
    done = run_mpi(3, flags + ["--out", str(out), "--epochs", "2", "--device", "cuda"],
                   timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["devices"] == ["cuda:0"] * 3 and all(config["gpu_names"])
    state = torch.load(out / "model.pt", map_location="cpu")
    assert all(t.device.type == "cpu" for t in state.values())
    done = run_mpi(3, flags + ["--resume", str(out), "--epochs", "3", "--device", "cpu"],
                   timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2, 3]
    done = run_mpi(3, flags + ["--resume", str(out), "--epochs", "4", "--device", "cuda"],
                   timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "final.json").read_text())["epochs"] == 4
