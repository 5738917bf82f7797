"""Baselines (docs/algorithms.md): BNS-GCN, FedAvg, FedAvg+nc, GraphSAGE, GraphSAINT.

Tiers: pure functions and samplers without MPI; a few real CLI runs (mpirun for the distributed
ones) on the toy graph that check the run directory and the exactness claims:
bns with p = 1 == ours --sampling none; fedavg with one client == centralized full batch.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from graphs import random_parts, write_shards
from mpi_util import REPO, run_mpi, run_python
from mpifgl.methods.bns import BoundaryNodeSampler
from mpifgl.methods.fedavg import (fedavg_contribution, fedavg_result, local_graph,
                                     weighted_average)
from mpifgl.methods.sampled import (NeighbourSampler, RandomWalkSampler, sample_neighbours,
                                      saint_normalisation)
from mpifgl.graph import ClientGraph

TRAIN = ["-m", "mpifgl.train"]
TINY = ["--hidden", "8", "--log-every", "100", "--save-logits", "--force"]
PROBE_NC = str(REPO / "tests" / "mpi_scripts" / "probe_fedavg_nc.py")


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


def run_ok(done) -> None:
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])


# -- pure functions ------------------------------------------------------------------------------


def test_fedavg_weighted_average_hand_computed():
    a, b = np.array([1.0, 2.0, -4.0]), np.array([3.0, 0.0, 4.0])
    # weights 1 and 3: (1*a + 3*b) / 4
    assert np.allclose(weighted_average([a, b], [1, 3]), [2.5, 0.5, 2.0], atol=0, rtol=1e-15)
    assert np.allclose(weighted_average([a, b], [0, 5]), b)
    contribution = fedavg_contribution(a, 2.0, loss=0.5)
    assert np.allclose(contribution, [2.0, 4.0, -8.0, 1.0, 2.0])
    params, loss = fedavg_result(contribution + fedavg_contribution(b, 2.0, loss=1.5))
    assert np.allclose(params, [2.0, 1.0, 0.0]) and loss == pytest.approx(1.0)
    with pytest.raises(ValueError, match="weight 0"):
        fedavg_result(fedavg_contribution(a, 0.0, 1.0))


def test_fedavg_local_graph_drops_cross_edges(toy_graph, toy_shards):
    shard_dir = toy_shards(3)
    sizes = read_manifest(shard_dir).client_sizes()
    graph = ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(1)), sizes)
    local = local_graph(graph)
    assert (local.graph.inner != graph.inner).nnz == 0
    assert np.array_equal(local.graph.degree, np.diff(graph.inner.indptr))
    assert local.graph.cross.nnz == 0 and local.num_own == graph.num_nodes


def test_bns_sampler_keeps_inner_nodes_and_scales_boundary():
    boundary = np.array([False, True, True, False, True] * 200)
    sampler = BoundaryNodeSampler(boundary, 0.3, np.random.default_rng(0))
    kept = np.zeros(boundary.shape[0])
    for _ in range(200):
        sample = sampler.sample()
        assert np.all(np.diff(sample.index) > 0)
        assert set(np.flatnonzero(~boundary)) <= set(sample.index.tolist())
        assert np.array_equal(sample.probability, np.where(boundary[sample.index], 0.3, 1.0))
        kept[sample.index] += 1
    assert kept[boundary].mean() / 200 == pytest.approx(0.3, abs=0.01)
    everything = BoundaryNodeSampler(boundary, 1.0, np.random.default_rng(0)).sample()
    assert np.array_equal(everything.index, np.arange(boundary.shape[0]))


def test_graphsage_sampler_respects_fanouts(toy_graph):
    adjacency = toy_graph.adj.tocsr()
    rng = np.random.default_rng(0)
    # One node: exactly min(fanout, degree) distinct neighbours, all real.
    hub = int(np.argmax(np.diff(adjacency.indptr)))
    neighbours = set(adjacency.indices[adjacency.indptr[hub]:adjacency.indptr[hub + 1]].tolist())
    for fanout in (1, 3, 100):
        picked, node = sample_neighbours(adjacency.indptr.astype(np.int64),
                                         adjacency.indices.astype(np.int64), np.array([hub]),
                                         fanout, rng)
        assert len(set(picked.tolist())) == picked.shape[0] == min(fanout, len(neighbours))
        assert set(picked.tolist()) <= neighbours and np.all(node == hub)
    fanouts = [3, 2]
    sampler = NeighbourSampler(adjacency, fanouts, rng)
    for _ in range(20):
        seeds = rng.choice(toy_graph.num_nodes, 10, replace=False)
        batch = sampler.sample(seeds)
        nodes, edge_index = batch.nodes, batch.edge_index
        assert batch.node_counts[0] == 10 and batch.node_counts[-1] == nodes.shape[0]
        assert batch.edge_counts[-1] == edge_index.shape[1]
        hop1 = edge_index[:, :batch.edge_counts[1]]
        assert np.all(hop1[1] < 10), "hop-1 edges must end at the seeds"
        assert np.array_equal(nodes[:10], seeds) and len(set(nodes.tolist())) == nodes.shape[0]
        source, target = nodes[edge_index[0]], nodes[edge_index[1]]
        assert np.all(adjacency[source, target] == 1), "a sampled edge is not in the graph"
        incoming = np.bincount(edge_index[1], minlength=nodes.shape[0])
        assert np.all(incoming[:10] <= fanouts[0])  # seeds: hop 1
        assert np.all(incoming[10:] <= fanouts[1])  # nodes first reached at hop 1: hop 2
        degree = np.diff(adjacency.indptr)[seeds]
        assert np.array_equal(incoming[:10], np.minimum(degree, fanouts[0]))
        assert not (sampler._position >= 0).any(), "scratch positions not reset"


def test_trimmed_graphsage_batch_equals_the_untrimmed_pyg_stack(toy_graph):
    """Each layer computes only the nodes the next one needs (sparse adjacency per layer); the
    seeds' logits and every weight gradient equal PyG's SAGEConv stack run on the whole sampled
    subgraph with a plain edge_index."""
    from torch_geometric.nn import SAGEConv
    from mpifgl.methods.sampled import PyGStack
    adjacency = toy_graph.adj.tocsr()
    sampler = NeighbourSampler(adjacency, [4, 3, 2], np.random.default_rng(3))
    batch = sampler.sample(np.random.default_rng(4).choice(toy_graph.num_nodes, 7, replace=False))
    x = torch.from_numpy(np.asarray(toy_graph.x, np.float64))[torch.from_numpy(batch.nodes)]
    model = PyGStack(lambda i, o: SAGEConv(i, o), [x.shape[1], 6, 5, 3], 0.0, 0, torch.float64)
    trimmed = model(x, batch.layer_adjacencies(torch.float64))
    assert trimmed.shape[0] == 7
    z, edge_index = x, torch.from_numpy(batch.edge_index)
    for k, layer in enumerate(model.layers):
        z = layer(z, edge_index)
        z = torch.relu(z) if k < 2 else z
    full = z[:7]
    assert (trimmed - full).abs().max().item() < 1e-12
    grads = [torch.autograd.grad(out.square().sum(), list(model.parameters()))
             for out in (trimmed, full)]
    for a, b in zip(*grads):
        assert (a - b).abs().max().item() < 1e-12


def test_graphsaint_normalisation_is_unbiased(toy_graph):
    adjacency = toy_graph.adj.tocsr()
    sampler = RandomWalkSampler(adjacency, roots=6, walk_length=2, rng=np.random.default_rng(1))
    loss_weight, edge_norm, mean_size = saint_normalisation(sampler, toy_graph.train_mask,
                                                            coverage=400)
    assert np.all(loss_weight > 0) and np.all(edge_norm > 0) and mean_size > 6
    # Fresh subgraphs: sum of the loss weights over a subgraph's training nodes averages to 1,
    # and, given v is sampled, its incoming aggregator weights sum to deg(v) on average.
    fresh = RandomWalkSampler(adjacency, roots=6, walk_length=2, rng=np.random.default_rng(2))
    draws = 6000
    totals = np.empty(draws)
    incoming = np.zeros(toy_graph.num_nodes)
    present = np.zeros(toy_graph.num_nodes)
    for k in range(draws):
        nodes, edge_index, edge_ids = fresh.sample()
        totals[k] = loss_weight[nodes][toy_graph.train_mask[nodes]].sum()
        np.add.at(incoming, nodes[edge_index[1]], edge_norm[edge_ids])
        present[nodes] += 1
    assert totals.mean() == pytest.approx(1.0, abs=0.05)
    degree = np.diff(adjacency.indptr)
    seen = (present > 200) & (degree > 0)
    assert np.mean(incoming[seen] / present[seen] / degree[seen]) == pytest.approx(1.0, abs=0.1)


# -- real runs -------------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_bns_with_p1_equals_ours_full(toy_graph, toy_shards, tmp_path):
    shard_dir = toy_shards(2)
    common = ["--shards", str(shard_dir), "--epochs", "4", "--dtype", "float64", *TINY]
    run_ok(run_mpi(3, TRAIN + common + ["--algo", "bns", "--boundary-p", "1",
                                       "--out", str(tmp_path / "bns")], timeout=240))
    run_ok(run_mpi(3, TRAIN + common + ["--algo", "ours", "--sampling", "none",
                                        "--out", str(tmp_path / "ours")], timeout=240))
    check_run_dir(tmp_path / "bns", toy_graph.num_nodes, toy_graph.num_classes, 4)
    assert json.loads((tmp_path / "bns" / "config.json").read_text())["steps_per_epoch"] == 1
    bns, ours = metrics(tmp_path / "bns"), metrics(tmp_path / "ours")
    assert np.allclose([r["loss"] for r in bns], [r["loss"] for r in ours], atol=1e-6, rtol=0)
    assert np.allclose(np.load(tmp_path / "bns" / "logits.npy"),
                       np.load(tmp_path / "ours" / "logits.npy"), atol=1e-6, rtol=0)


@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_fedavg_one_client_equals_centralized(toy_graph, toy_shards, tmp_path):
    shard_dir = toy_shards(1)
    common = ["--shards", str(shard_dir), "--epochs", "5", "--dtype", "float64",
              "--dropout", "0", "--local-epochs", "1", *TINY]
    run_ok(run_mpi(2, TRAIN + common + ["--algo", "fedavg", "--out", str(tmp_path / "fedavg")],
                   timeout=240))
    run_ok(run_python(TRAIN + common + ["--algo", "centralized", "--sampling", "none",
                                        "--out", str(tmp_path / "central")], timeout=240))
    weights = check_run_dir(tmp_path / "fedavg", toy_graph.num_nodes, toy_graph.num_classes, 5)
    reference = torch.load(tmp_path / "central" / "model.pt")
    fedavg, central = metrics(tmp_path / "fedavg"), metrics(tmp_path / "central")
    for key in ("loss", "train_micro_f1", "test_micro_f1"):
        assert np.allclose([r[key] for r in fedavg], [r[key] for r in central], atol=1e-10), key
    assert weights.keys() == reference.keys()
    for name in weights:
        assert torch.allclose(weights[name], reference[name], atol=1e-10, rtol=0), name
    assert np.allclose(np.load(tmp_path / "fedavg" / "logits.npy"),
                       np.load(tmp_path / "central" / "logits.npy"), atol=1e-10)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_fedavg_nc_collects_neighbours_with_owners_features(toy_graph, tmp_path):
    parts = random_parts(toy_graph.num_nodes, 3, seed=0)
    shard_dir = write_shards(toy_graph, parts, tmp_path / "shards")
    out = tmp_path / "nc.npz"
    run_ok(run_mpi(4, [PROBE_NC, str(shard_dir), str(out), "0.2"], timeout=240))
    results = np.load(out)
    members = [np.flatnonzero(parts == j) for j in range(3)]
    client_ordered_to_global = np.concatenate(members)
    adjacency = toy_graph.adj.toarray()
    for i in range(3):
        collected, candidates = results[f"collected_{i}"], results[f"candidates_{i}"]
        assert collected.shape[0] == round(0.2 * candidates.shape[0]) > 0
        assert len(set(collected.tolist())) == collected.shape[0]
        assert set(collected.tolist()) <= set(candidates.tolist())
        added = client_ordered_to_global[collected]
        assert np.all(parts[added] != i), "collected one of its own nodes"
        assert np.array_equal(results[f"added_x_{i}"], toy_graph.x[added])
        own = members[i]
        local = results[f"adjacency_{i}"]
        n_i = own.shape[0]
        assert np.array_equal(local[:n_i, :n_i], adjacency[np.ix_(own, own)])
        assert np.array_equal(local[:n_i, n_i:], adjacency[np.ix_(own, added)])
        assert not local[n_i:, n_i:].any(), "edges among added nodes are unknown to client i"
        assert np.array_equal(results[f"degree_{i}"], local.sum(axis=1))


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_fedavg_nc_end_to_end_and_resume(toy_graph, toy_shards, tmp_path):
    """2 clients, 2 local epochs; a run resumed at epoch 2 continues bit for bit (every client's
    own Adam state is in the checkpoint)."""
    shard_dir = toy_shards(2)
    common = ["--shards", str(shard_dir), "--algo", "fedavg-nc", "--local-epochs", "2", *TINY]
    run_ok(run_mpi(3, TRAIN + common + ["--epochs", "4", "--out", str(tmp_path / "straight")],
                   timeout=120))
    run_ok(run_mpi(3, TRAIN + common + ["--epochs", "2", "--checkpoint-every", "2",
                                        "--out", str(tmp_path / "resumed")], timeout=120))
    run_ok(run_mpi(3, TRAIN + ["--resume", str(tmp_path / "resumed"), "--epochs", "4",
                               "--save-logits"], timeout=120))
    check_run_dir(tmp_path / "straight", toy_graph.num_nodes, toy_graph.num_classes, 4)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert [r["loss"] for r in straight] == [r["loss"] for r in resumed]
    assert np.array_equal(np.load(tmp_path / "straight" / "logits.npy"),
                          np.load(tmp_path / "resumed" / "logits.npy"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo,keys", [
    ("graphsage", ["layers.0.lin_l.weight", "layers.0.lin_l.bias", "layers.0.lin_r.weight"]),
    ("graphsaint", ["layers.0.lin.weight", "layers.0.bias"])])
def test_centralized_baselines_end_to_end(toy_graph, toy_shards, tmp_path, algo, keys):
    shard_dir = toy_shards(2)
    run_ok(run_python(TRAIN + ["--algo", algo, "--shards", str(shard_dir), "--epochs", "3",
                               "--batch-size", "8", "--fanouts", "4,3", "--out",
                               str(tmp_path / algo), *TINY], timeout=240))
    weights = check_run_dir(tmp_path / algo, toy_graph.num_nodes, toy_graph.num_classes, 3)
    assert set(keys) <= set(weights)
    assert f"layers.1.{keys[0].split('.', 2)[2]}" in weights
    layer_of = [int(name.split(".")[1]) for name in weights]
    assert layer_of == sorted(layer_of), "state_dict keys must name the layers in order"


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_graphsaint_full_graph_model_is_our_backbone(toy_shards, backbone):
    """Evaluation path of graphsaint: PyG GCNConv(normalize=False) / GraphConv with our edge
    weights equals our own GCN / 1-GNN given the same weights (the keys are the same too)."""
    from mpifgl.communicator import LocalComm
    from mpifgl.config import TrainConfig
    from mpifgl.methods import build_trainer
    shard_dir = toy_shards(2)
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(2)])
    config = TrainConfig(algo="graphsaint", backbone=backbone, dtype="float64", hidden=8,
                         batch_size=6, sampling="none")
    saint = build_trainer(config, LocalComm(), merged, manifest.num_classes).method
    ours = build_trainer(config.replace(algo="centralized"), LocalComm(), merged,
                         manifest.num_classes).method
    ours.model.load_state_dict(saint.model.state_dict())
    difference = (saint.full_logits() - ours.full_logits()).abs().max().item()
    assert difference < 1e-10, difference


def test_steps_per_epoch_zero_is_one_pass_for_ours_and_one_step_for_the_rest(toy_shards):
    """--steps-per-epoch 0 (the default): ours draws s = n/4 per step and takes ceil(n / s) = 4
    steps; an explicit value or another s changes it; without node sampling and for every
    baseline it is 1. The resolved values are what config.json records (trainer.config)."""
    from mpifgl.communicator import LocalComm
    from mpifgl.config import TrainConfig
    from mpifgl.methods import build_trainer
    shard_dir = toy_shards(2)
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(2)])
    n = merged.num_nodes

    def resolved(**flags) -> TrainConfig:
        config = TrainConfig(hidden=8, batch_size=6, **flags)
        return build_trainer(config, LocalComm(), merged, manifest.num_classes).config

    ours = resolved(algo="centralized", sampling="label")
    assert (ours.sample_size, ours.steps_per_epoch) == (round(n / 4), 4)
    assert resolved(algo="centralized", sampling="uniform", sample_size=n // 2 + 1) \
        .steps_per_epoch == 2
    assert resolved(algo="centralized", sampling="label", steps_per_epoch=3).steps_per_epoch == 3
    full = resolved(algo="centralized", sampling="none")
    assert (full.sample_size, full.steps_per_epoch) == (0, 1)
    for algo in ("graphsage", "graphsaint"):
        assert resolved(algo=algo).steps_per_epoch == 1, algo


@pytest.mark.parametrize("conv", ["sage", "gcn", "graphconv"])
def test_sparse_input_features_give_the_dense_convs_numbers(toy_graph, conv):
    """Sparse (bag-of-words) inputs go through the first conv transform-first with the conv's
    own parameters: logits and every gradient equal the PyG conv on the dense rows (1e-10), for
    a trimmed GraphSAGE batch and for one whole-graph adjacency (GraphSAINT, evaluation)."""
    import scipy.sparse as sp
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
    from mpifgl.methods.sampled import PyGStack
    from mpifgl.graph import torch_csr
    from mpifgl.model import SparseFeatures, make_features
    make = {"sage": lambda i, o: SAGEConv(i, o, aggr="mean"),
            "gcn": lambda i, o: GCNConv(i, o, normalize=False, add_self_loops=False),
            "graphconv": lambda i, o: GraphConv(i, o)}[conv]
    adjacency = toy_graph.adj.tocsr()
    x = np.asarray(toy_graph.x, np.float64).copy()
    x[x < 0.5] = 0.0  # bag-of-words-like: mostly zeros
    sparse = make_features(x, torch.float64, "sparse")
    assert isinstance(sparse, SparseFeatures)
    model = PyGStack(make, [x.shape[1], 6, 3], 0.0, 0, torch.float64)
    sampler = NeighbourSampler(adjacency, [4, 3], np.random.default_rng(3))
    batch = sampler.sample(np.arange(0, toy_graph.num_nodes, 9))
    weights = (np.random.default_rng(5).random(adjacency.nnz) + 0.5 if conv != "sage"
               else np.ones(adjacency.nnz))  # SAGE's mean aggregation takes unit weights
    whole = torch_csr(sp.csr_matrix((weights, adjacency.indices, adjacency.indptr),
                                    shape=adjacency.shape), torch.float64)
    cases = [(whole, np.arange(toy_graph.num_nodes))]
    if conv != "gcn":  # GCNConv has no bipartite (trimmed) form; GraphSAINT uses it whole
        cases.append((batch.layer_adjacencies(torch.float64), batch.nodes))
    for adj, rows in cases:
        dense_x = torch.from_numpy(x[rows])
        sparse_x = sparse.rows(rows)
        outputs = [model(dense_x, adj), model(sparse_x, adj)]
        assert torch.allclose(outputs[0], outputs[1], rtol=1e-10, atol=1e-12)
        grads = [torch.autograd.grad(out.square().sum(), list(model.parameters()))
                 for out in outputs]
        for a, b in zip(*grads):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
