"""--device cuda (tests/gpu; skipped where torch sees no GPU): distributed on CUDA equals
centralized on the CPU (1e-10 float64, 1e-5 float32, relative to the largest value), with
--secure, with a client that has no cross edge, in every exchange mode; every --algo trains on
CUDA; a checkpoint written on CUDA resumes on the CPU and back; a real mpirun run on CUDA
records its GPU. Ranks are threads (tests/helpers/thread_comm.py) except in the mpirun test."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.registry import EXCHANGES, METHODS
from tests.helpers.exactness import (TOLERANCE, assert_close, centralized_reference,
                                     fixed_sample, flat_grads, gather_in_global_order,
                                     operator_logits, two_islands_graph)
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import run_mpi
from tests.helpers.thread_comm import ThreadWorld

CUDA = torch.device("cuda", 0)


def shards(graph, tmp_path, clients: int, parts=None):
    parts = random_parts(graph.num_nodes, clients, seed=4) if parts is None else parts
    return write_shards(graph, parts, tmp_path / f"shards-{clients}")


def distributed_step(shard_dir, config: TrainConfig, sampled: bool, device=CUDA):
    """One forward/backward on every rank (threads) -> (loss, grads, logits by global id)."""
    manifest = read_manifest(shard_dir)

    def body(comm):
        graph = ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id)
        gnn = build_trainer(config, comm, graph, manifest.num_classes, device=device).method
        if sampled:
            own = (fixed_sample(manifest.client_sizes())[comm.client_id] if comm.is_client
                   else None)
            operator, rows = gnn.operator_for_sample(own)
        else:
            operator, rows = gnn.full_operator, gnn.setup.global_split_counts["train"]
        loss = gnn.loss_and_gradients(operator, rows)
        logits, _ = gather_in_global_order(
            comm, operator_logits(comm, gnn, operator, manifest.num_classes),
            graph.global_id[operator.rows.cpu().numpy()])
        return loss, flat_grads(gnn.model), logits

    return ThreadWorld(manifest.num_clients + 1).run(body)[0]


def config_for(shard_dir, dtype: str, **flags) -> TrainConfig:
    values = dict(shards=str(shard_dir), dtype=dtype, dropout=0.0, sampling="none", layers=2,
                  hidden=16, seed=3)
    values.update(flags)
    return TrainConfig(**values)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("sampled", [False, True])
def test_cuda_distributed_equals_cpu_centralized(toy_graph, tmp_path, backbone, dtype, sampled):
    shard_dir = shards(toy_graph, tmp_path, 3)
    found = distributed_step(shard_dir, config_for(shard_dir, dtype, backbone=backbone), sampled)
    expected = centralized_reference(shard_dir, backbone, dtype, 2, sampled)[:3]
    for name, a, b in zip(("loss", "grads", "logits"), found, expected):
        assert_close(a, b, TOLERANCE[dtype], f"{backbone} {dtype} {name} (cuda vs cpu)")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(EXCHANGES))
def test_every_exchange_mode_on_cuda_with_one_row_chunks(toy_graph, tmp_path, mode):
    shard_dir = shards(toy_graph, tmp_path, 3)
    config = config_for(shard_dir, "float64", exchange=mode, exchange_buffer_mb=1e-6)
    found = distributed_step(shard_dir, config, True)
    expected = centralized_reference(shard_dir, "gcn", "float64", 2, True)[:3]
    for name, a, b in zip(("loss", "grads", "logits"), found, expected):
        assert_close(a, b, TOLERANCE["float64"], f"{mode} {name}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_secure_on_cuda_equals_centralized(toy_graph, tmp_path, dtype):
    shard_dir = shards(toy_graph, tmp_path, 3)
    found = distributed_step(shard_dir, config_for(shard_dir, dtype, secure=True), True)
    expected = centralized_reference(shard_dir, "gcn", dtype, 2, True)[:3]
    for name, a, b in zip(("loss", "grads", "logits"), found, expected):
        assert_close(a, b, TOLERANCE[dtype], f"secure {dtype} {name}")


@pytest.mark.timeout(300)
def test_a_client_with_no_cross_edge_on_cuda(tmp_path):
    graph, parts = two_islands_graph()
    shard_dir = shards(graph, tmp_path, 3, parts)
    found = distributed_step(shard_dir, config_for(shard_dir, "float64"), False)
    expected = centralized_reference(shard_dir, "gcn", "float64", 2)[:3]
    for name, a, b in zip(("loss", "grads", "logits"), found, expected):
        assert_close(a, b, TOLERANCE["float64"], f"islands {name}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", list(METHODS))
def test_every_algo_trains_on_cuda(toy_graph, tmp_path, algo):
    """Two steps of every method on the GPU: finite losses, logits on the GPU, every rank's
    model the same."""
    method = METHODS[algo]
    shard_dir = shards(toy_graph, tmp_path, 3 if method.distributed else 1)
    manifest = read_manifest(shard_dir)
    config = method.with_defaults(TrainConfig(shards=str(shard_dir), algo=algo, hidden=16,
                                              batch_size=16, fanouts=(4, 3)), set())

    def body(comm):
        if method.distributed:
            graph = ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id)
        else:
            graph = ClientGraph.merged([load_client_shard(shard_dir / "client_0.h5")])
        trainer = build_trainer(config, comm, graph, manifest.num_classes, device=CUDA)
        losses = [trainer.train_step() for _ in range(2)]
        logits = trainer.method.full_logits()
        return losses, logits.device.type, [p.detach().cpu() for p in trainer.model.parameters()]

    results = (ThreadWorld(manifest.num_clients + 1).run(body) if method.distributed
               else [body(LocalComm())])
    for losses, device, parameters in results:
        assert all(np.isfinite(losses)) and device == "cuda"
        assert all(torch.equal(a, b) for a, b in zip(parameters, results[0][2]))


@pytest.mark.timeout(600)
def test_mpirun_on_cuda_records_the_gpu_and_resumes_on_the_cpu(toy_graph, tmp_path):
    """A real run: 3 ranks on the GPU with checkpoints; its model.pt loads without a GPU; the
    run resumes on the CPU, and a CPU checkpoint resumes on the GPU."""
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
