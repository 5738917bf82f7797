"""mpifgl.methods.cagnet without mpirun (ranks are threads, tests/helpers/thread_comm.py): the
stages are the reference's, a step equals the centralized one in float64 to 1e-10 for 2 and 4
clients with replication 1 and 2, every rank (the server too) keeps the same parameters, each
client's bytes are the schedule's formula, the replicas of a block row draw the same dropout
masks, a trained run scores as centralized, and bad flags stop the run at start."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fgl_common.shard_format import read_manifest
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.methods.cagnet import step_traffic, stage_blocks
from mpifgl.model import flatten
from tests.helpers.exactness import (assert_close, centralized_reference, flat_grads,
                                     gather_in_global_order)
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.runs import threaded_program
from tests.helpers.thread_comm import ThreadWorld

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # ranks are threads
LAYERS = 3


@pytest.mark.parametrize("blocks,replicas,expected", [
    (4, 1, [[0, 1, 2, 3]]),  # 1D: every block on the one replica
    (2, 2, [[0], [1]]),  # P = 4, c = 2
    (4, 2, [[0, 1], [2, 3]]),  # P = 8, c = 2
    (1, 2, [[], [0]]),  # P = 2, c = 2: P/c^2 = 0, the last replica takes the block
    (3, 2, [[0], [1, 2]]),  # P = 6, c = 2: the last replica takes the rest
    (2, 4, [[], [], [], [0, 1]]),  # P = 8, c = 4
])
def test_the_stages_are_the_references(blocks, replicas, expected):
    assert [list(stage_blocks(j, replicas, blocks)) for j in range(replicas)] == expected


def test_the_traffic_formula_by_hand():
    """1D, 2 clients of 5 and 7 nodes, one layer 2 -> 3, float64: client 0 broadcasts its H
    (80 bytes) and its G (120) and receives client 1's (112, 168); both allreduce the 9
    gradients (72) and the loss (8); client 0 sends the server the gradients and loss (80)."""
    assert step_traffic(np.asarray([5, 7]), 1, [2, 3], 8) == [(360, 360), (360, 280)]


def cagnet_config(shard_dir, replication: int, **flags) -> TrainConfig:
    values = dict(shards=str(shard_dir), algo="cagnet", replication=replication,
                  dtype="float64", dropout=0.0, sampling="none", layers=LAYERS, hidden=16,
                  seed=3)
    values.update(flags)
    return TrainConfig(**values)


def every_rank(shard_dir, config: TrainConfig, body) -> list:
    """``body(comm, method, graph)`` on every rank of a world of 1 server + the shards' clients."""
    manifest = read_manifest(shard_dir)

    def rank(comm):
        graph = ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id)
        method = build_trainer(config, comm, graph, manifest.num_classes).method
        return body(comm, method, graph)

    return ThreadWorld(manifest.num_clients + 1).run(rank)


@pytest.mark.parametrize("num_clients,replication", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_a_cagnet_step_equals_the_centralized_one(toy_graph, tmp_path, num_clients, replication):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=5),
                             tmp_path / "shards")

    def body(comm, method, graph):
        loss = method.loss_and_gradients() if comm.is_client else None
        grads = flat_grads(method.model)
        logits, _ = gather_in_global_order(comm, method.full_logits().numpy(), graph.global_id)
        comm.reset_counters()
        method.train_step()
        return (loss, grads, logits, (comm.bytes_sent, comm.bytes_received),
                flatten(method.model.parameters()).numpy())

    found = every_rank(shard_dir, cagnet_config(shard_dir, replication), body)
    loss, grads, logits, _ = centralized_reference(shard_dir, "gcn", "float64", LAYERS)
    for client_loss, client_grads, *_ in found[1:]:
        assert_close(client_loss, loss, 1e-10, "loss")
        assert_close(client_grads, grads, 1e-10, "gradients")
    assert_close(found[0][2], logits, 1e-10, "logits")
    assert all(np.array_equal(rank[4], found[0][4]) for rank in found), "parameters differ"
    widths = [toy_graph.x.shape[1]] + [16] * (LAYERS - 1) + [toy_graph.num_classes]
    sizes = np.asarray(read_manifest(shard_dir).client_sizes())
    assert [rank[3] for rank in found[1:]] == step_traffic(sizes, replication, widths, 8)


def test_the_replicas_of_a_block_row_draw_the_same_dropout_masks(toy_graph, tmp_path):
    """With dropout, replicas that drew other masks would send their column groups other sums,
    and the copies of the model would part: after two steps every rank holds the same bits."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 4, seed=5),
                             tmp_path / "shards")

    def body(comm, method, graph):
        for _ in range(2):
            method.train_step()
        return flatten(method.model.parameters()).numpy()

    found = every_rank(shard_dir, cagnet_config(shard_dir, 2, dropout=0.5, dtype="float32"),
                       body)
    assert all(np.array_equal(rank, found[0]) for rank in found)


def test_a_trained_cagnet_run_scores_as_centralized(program, toy_shards, tmp_path):
    """20 epochs in float32, same seed, no dropout: the same test micro-F1 (within 0.2 points),
    the losses to float32 rounding, the same epoch of time to target, and a tensor report per
    rank in final.json."""
    common = ["--shards", toy_shards(4), "--epochs", "20", "--dropout", "0", "--hidden", "8",
              "--log-every", "100", "--target-val-f1", "0.4"]
    assert threaded_program(["--algo", "cagnet", "--out", tmp_path / "cagnet", *common],
                            5) == [0] * 5
    assert program("--algo", "centralized", "--out", tmp_path / "central", *common)[0] == 0
    finals = {name: json.loads((tmp_path / name / "final.json").read_text())
              for name in ("cagnet", "central")}
    assert abs(finals["cagnet"]["test_micro_f1"] - finals["central"]["test_micro_f1"]) <= 0.002
    losses = {name: [json.loads(line)["loss"] for line in
                     (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
              for name in finals}
    assert np.allclose(losses["cagnet"], losses["central"], atol=1e-5, rtol=0)
    assert finals["cagnet"]["target_epoch"] == finals["central"]["target_epoch"] is not None
    reports = finals["cagnet"]["rank_reports"]
    assert len(reports) == 5 and all(r["tensor_bytes"]["adjacency"] > 0 for r in reports[1:])
    assert reports[0]["tensor_bytes"]["features"] == 0  # the server holds the model only


def test_a_replication_that_does_not_divide_the_clients_stops_every_rank(
        toy_shards, tmp_path, capsys):
    shards = toy_shards(4)
    assert threaded_program(["--algo", "cagnet", "--replication", "3", "--shards", shards,
                             "--out", tmp_path / "run", "--epochs", "1"], 5) == [1] * 5
    assert capsys.readouterr().err.strip().splitlines() == [
        f"mpifgl.train: error: --replication is 3, expected a divisor of the 4 clients of "
        f"{shards}: one of 1, 2, 4"]
    assert not (tmp_path / "run").exists()


def test_cagnet_refuses_other_layers_sampling_and_masking(program, toy_shards, tmp_path):
    with pytest.raises(ValueError, match=r"^--backbone is 'sage', expected gcn with --algo "
                                         r"cagnet \(CAGNET trains GCN layers\)$"):
        TrainConfig(algo="cagnet", backbone="sage").validate()
    with pytest.raises(ValueError, match=r"^--replication is 0, expected an integer >= 1$"):
        TrainConfig(algo="cagnet", replication=0).validate()
    with pytest.raises(ValueError, match=r"^--secure with --algo 'cagnet'"):
        TrainConfig(algo="cagnet", secure=True).validate()
    assert program("--algo", "cagnet", "--sampling", "label", "--shards", toy_shards(2),
                   "--out", tmp_path / "run") == (2, [
                       "mpifgl.train: error: --sampling is 'label', expected none with --algo "
                       "cagnet (CAGNET is exact full-batch training)"])
    assert not (tmp_path / "run").exists()
