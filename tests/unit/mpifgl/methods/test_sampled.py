"""mpifgl.methods.sampled: GraphSAGE and GraphSAINT samplers and models against PyG (the
program runs are in tests/e2e/test_train.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.methods.sampled import (NeighbourSampler, RandomWalkSampler, sample_neighbours,
                                      saint_normalisation)
from mpifgl.graph import ClientGraph


# -- pure functions ------------------------------------------------------------------------------


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


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_the_pyg_stack_with_dropout_is_relu_then_dropout_of_each_input(toy_graph, conv):
    """Training with dropout: the stack's logits and weight gradients equal its convs called one
    by one, each input dropped from the same stream and relu between them, bit for bit (the
    stack drops a hidden input with its relu in one step)."""
    from torch_geometric.nn import GCNConv, SAGEConv
    from mpifgl.methods.sampled import PyGStack
    from mpifgl.model import dropout
    make = (lambda i, o: GCNConv(i, o)) if conv == "gcn" else (lambda i, o: SAGEConv(i, o))
    x = torch.from_numpy(np.asarray(toy_graph.x, np.float64))
    adjacency = toy_graph.adj.tocsr()
    sparse = torch.sparse_csr_tensor(torch.from_numpy(adjacency.indptr.astype(np.int64)),
                                     torch.from_numpy(adjacency.indices.astype(np.int64)),
                                     torch.ones(adjacency.nnz, dtype=torch.float64),
                                     adjacency.shape)
    model = PyGStack(make, [x.shape[1], 6, 5, 3], 0.5, 0, torch.float64)
    rng, expected_rng = np.random.default_rng(8), np.random.default_rng(8)
    found = model(x, sparse, rng)
    z = x
    for k, layer in enumerate(model.layers):
        z = layer(dropout(z, 0.5, expected_rng), sparse)
        z = torch.relu(z) if k < 2 else z
    assert torch.equal(found, z)
    grads = [torch.autograd.grad(out.square().sum(), list(model.parameters()))
             for out in (found, z)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert rng.bit_generator.state == expected_rng.bit_generator.state


@pytest.mark.usefixtures("one_torch_thread")  # thousands of tiny products: no thread to wake
def test_graphsaint_normalisation_is_unbiased(toy_graph):
    """The estimated coefficients on 1500 fresh subgraphs: a subgraph's loss-weight total has a
    standard deviation of about 0.27, so its mean has a standard error of 0.007 and the 0.05
    tolerance is 7 of them; nodes in >= 50 subgraphs (1 in 30, every node with neighbours
    here) average their incoming weight sums."""
    adjacency = toy_graph.adj.tocsr()
    sampler = RandomWalkSampler(adjacency, roots=6, walk_length=2, rng=np.random.default_rng(1))
    loss_weight, edge_norm, mean_size = saint_normalisation(sampler, toy_graph.train_mask,
                                                            coverage=400)
    assert np.all(loss_weight > 0) and np.all(edge_norm > 0) and mean_size > 6
    # Fresh subgraphs: sum of the loss weights over a subgraph's training nodes averages to 1,
    # and, given v is sampled, its incoming aggregator weights sum to deg(v) on average.
    fresh = RandomWalkSampler(adjacency, roots=6, walk_length=2, rng=np.random.default_rng(2))
    draws = 1500
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
    seen = (present > draws / 30) & (degree > 0)
    assert np.mean(incoming[seen] / present[seen] / degree[seen]) == pytest.approx(1.0, abs=0.1)


# -- real runs -------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("conv", ["sage", "gcn", "graphconv"])
def test_sparse_input_features_give_the_dense_convs_numbers(toy_graph, conv):
    """Sparse (bag-of-words) inputs go through the first conv transform-first with the conv's
    own parameters: logits and every gradient equal the PyG conv on the dense rows (1e-10), for
    a trimmed GraphSAGE batch and for one whole-graph adjacency (GraphSAINT, evaluation)."""
    import scipy.sparse as sp
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
    from mpifgl.methods.sampled import PyGStack
    from mpifgl.model import make_features
    from mpifgl.operators import SparseFeatures, torch_csr
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
        sparse_x = sparse.rows(torch.from_numpy(rows))
        outputs = [model(dense_x, adj), model(sparse_x, adj)]
        assert torch.allclose(outputs[0], outputs[1], rtol=1e-10, atol=1e-12)
        grads = [torch.autograd.grad(out.square().sum(), list(model.parameters()))
                 for out in outputs]
        for a, b in zip(*grads):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layer", ["backbone", "sage"])
def test_graphsaint_without_coverage_trains_on_each_subgraph_alone(toy_shards, layer):
    """--saint-coverage 0 (OGB's products example): a step's loss is PyG's own layer (GCNConv
    with its normalisation and self loops, or SAGEConv with mean aggregation) on the induced
    subgraph as a graph of its own, the loss a plain mean over the subgraph's training nodes;
    and with --saint-layer sage the evaluation is PyG's SAGE on the whole graph (1e-10)."""
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv, SAGEConv
    from mpifgl.communicator import LocalComm
    from mpifgl.config import TrainConfig
    from mpifgl.methods import build_trainer
    shard_dir = toy_shards(2)
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(2)])
    config = TrainConfig(algo="graphsaint", dtype="float64", hidden=8, dropout=0.0,
                         batch_size=6, walk_length=3, saint_coverage=0.0, saint_layer=layer)
    saint = build_trainer(config, LocalComm(), merged, manifest.num_classes).method
    x, y = np.asarray(merged.x, np.float64), np.asarray(merged.y)

    def reference(rows: np.ndarray, edge_index: np.ndarray) -> torch.Tensor:
        z, edges = torch.from_numpy(x[rows]), torch.from_numpy(edge_index)
        with torch.no_grad():
            for k, own in enumerate(saint.model.layers):
                conv = (SAGEConv(own.lin_l.in_channels, own.lin_l.out_channels, aggr="mean")
                        if layer == "sage" else
                        GCNConv(own.lin.in_channels, own.lin.out_channels)).double()
                conv.load_state_dict(own.state_dict())
                z = conv(z, edges)
                z = z.relu() if k < len(saint.model.layers) - 1 else z
        return z

    if layer == "sage":
        whole = merged.inner.tocoo()
        expected = reference(np.arange(merged.num_nodes), np.vstack([whole.col, whole.row]))
        difference = (saint.full_logits() - expected).abs().max().item()
        assert difference < 1e-10, difference
    nodes, edge_index, edge_ids = saint.walk_sampler.sample()
    assert edge_index.shape[1] > nodes.shape[0], "the subgraph must have edges to test"
    saint.walk_sampler.sample = lambda: (nodes, edge_index, edge_ids)
    saint.subgraphs_per_pass = 1
    train = torch.from_numpy(np.asarray(merged.train_mask)[nodes])
    assert 0 < int(train.sum()) < nodes.shape[0]
    labels = torch.from_numpy(y[nodes])
    expected = F.cross_entropy(reference(nodes, edge_index)[train], labels[train])
    assert saint.train_step() == pytest.approx(expected.item(), rel=1e-10)
