"""Label-guided sampling: distribution, sizes, and the estimator's unbiasedness (no MPI).

The multi-client exchange is simulated in-process: every client computes its send buffer with
the real layer code, the sums a server would form are computed here, and each client finishes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from tests.helpers.exchange import FunctionHook, dense_terms
from tests.helpers.graphs import random_graph, random_parts, write_shards
from mpifgl.graph import ClientGraph, build_operator
from mpifgl.model import GCNLayer, OneGNNLayer
from mpifgl.sampling import (NodeSampler, client_sample_sizes, group_counts, inclusion_probability,
                             label_guided_distribution, node_groups, steps_for_sample)


def test_q_sums_to_one_per_client_and_follows_global_frequencies():
    rng = np.random.default_rng(0)
    clients = [rng.integers(0, 4, size) for size in (50, 30, 7)]
    global_counts = sum(np.bincount(g, minlength=4) for g in clients)
    for groups in clients:
        q = label_guided_distribution(groups, global_counts)
        assert q.shape == groups.shape and np.all(q > 0)
        assert abs(q.sum() - 1.0) < 1e-12
        present = np.unique(groups)
        mass = np.asarray([q[groups == k].sum() for k in present])
        # Each present group's mass is proportional to its GLOBAL count.
        np.testing.assert_allclose(mass, global_counts[present] / global_counts[present].sum())
        for k in present:  # spread evenly over the group's local members
            assert np.ptp(q[groups == k]) < 1e-15


def test_label_guided_rebalances_a_skewed_client():
    # Client holds 90 nodes of class 0 and 10 of class 1; globally the classes are balanced.
    groups = np.array([0] * 90 + [1] * 10)
    q = label_guided_distribution(groups, np.array([500, 500]))
    assert q[groups == 1].sum() == pytest.approx(0.5)  # the rare class gets half the draws


def test_groups_use_training_labels_only():
    y = np.array([0, 1, 2, 1])
    train = np.array([True, False, True, False])
    groups = node_groups(y, train, num_classes=3)
    assert groups.tolist() == [0, 3, 2, 3]
    assert group_counts(groups, 3).tolist() == [1, 0, 1, 2]


@pytest.mark.parametrize("sizes,total", [([10, 10, 10], 7), ([2708], 677), ([5, 17, 3, 1], 13),
                                          ([339, 338, 338], 250), ([4, 0, 4], 5)])
def test_sample_sizes_add_up(sizes, total):
    s = client_sample_sizes(sizes, total)
    assert s.sum() == total
    exact = np.asarray(sizes) * total / sum(sizes)
    assert np.all(np.abs(s - exact) < 1)


def test_inclusion_probability_matches_simulation():
    q = np.array([0.5, 0.3, 0.15, 0.05])
    p = inclusion_probability(q, 3)
    np.testing.assert_allclose(p, 1 - (1 - q) ** 3)
    rng = np.random.default_rng(1)
    sampler = NodeSampler(q, 3, rng)
    hits = np.zeros(4)
    for _ in range(20000):
        hits[sampler.sample().index] += 1
    np.testing.assert_allclose(hits / 20000, p, atol=0.015)


def _clients(tmp_path, num_clients=3, n=300):
    graph = random_graph(n=n, avg_degree=8, d=5, classes=3, seed=4, isolated=0)
    shard_dir = write_shards(graph, random_parts(n, num_clients, seed=2), tmp_path / "s")
    manifest = read_manifest(shard_dir)
    return [ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(i)),
                                   manifest.client_sizes()) for i in range(num_clients)]


def _layer_outputs(clients, layer, samples, probabilities, subgraph_degrees=False):
    """One layer on every client with a simulated server: returns H_i for each client."""
    dtype = torch.float64
    ops = [build_operator(c, "gcn" if isinstance(layer, GCNLayer) else "1gnn", samples,
                          probabilities[i] if probabilities else None, dtype, exchanged=True,
                          subgraph_degrees=subgraph_degrees)
           for i, c in enumerate(clients)]
    xs = [torch.from_numpy(c.x).to(dtype)[op.rows] for c, op in zip(clients, ops)]
    sends = []
    # pass 1: record what each client sends
    layer.cross_sums = [FunctionHook(lambda plan, y: (sends.append(dense_terms(plan, y)),
                                                      torch.zeros_like(y))[1])]
    for x, op in zip(xs, ops):
        layer(x, op)
    total = torch.stack(sends).sum(dim=0)
    starts = ops[0].exchange.segment_start
    layer.cross_sums = [FunctionHook(lambda plan, y: total[starts[plan.own_segment]:
                                                           starts[plan.own_segment + 1]])]
    return [layer(x, op) for x, op in zip(xs, ops)], ops


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("one_torch_thread")  # thousands of tiny products: no thread to wake
@pytest.mark.parametrize("layer_class", [GCNLayer, OneGNNLayer])
def test_sampled_first_layer_is_unbiased(tmp_path, layer_class):
    """Averaged over many label-guided samples, a sampled node's first-layer output converges to
    its full-graph output (paper Proposition 1); without 1/p (ours*) it does not.

    Statistic: for every node seen often enough and every output dimension,
    z = (sample mean - full output) / standard error of the mean. If the estimator is unbiased,
    mean(z^2) is about 1 (a chi-square average); we require < 1.5 with normalisation (300
    samples, nodes seen >= 50 times) and > 10 without it (its bias grows z^2 with the samples:
    the first 120, nodes seen >= 20 times, already give z^2 in the hundreds). 300 samples see a
    node about 120 times, so a bias of 7% of one sample's standard deviation already lifts
    mean(z^2) past 1.5 (about 0.9 here when unbiased). (Drawing with replacement adds a
    conditional bias of order 1/s_i, well inside.)"""
    torch.manual_seed(0)
    clients = _clients(tmp_path)
    layer = layer_class(5, 3).double()
    sizes = [c.num_nodes for c in clients]
    full, _ = _layer_outputs(clients, layer, [np.arange(s) for s in sizes], None)
    num_classes = 3
    groups = [node_groups(c.y, c.train_mask, num_classes) for c in clients]
    global_counts = sum(group_counts(g, num_classes) for g in groups)
    draws = client_sample_sizes(sizes, 150)
    rng = np.random.default_rng(7)
    samplers = [NodeSampler(label_guided_distribution(g, global_counts), int(s), rng)
                for g, s in zip(groups, draws)]
    trials, min_seen = {True: 300, False: 120}, {True: 50, False: 20}
    moments = {norm: [(np.zeros((s, 3)), np.zeros((s, 3))) for s in sizes] for norm in (True, False)}
    counts = {norm: [np.zeros(s) for s in sizes] for norm in (True, False)}
    with torch.no_grad():
        for trial in range(trials[True]):
            picked = [sampler.sample() for sampler in samplers]
            index = [p.index for p in picked]
            for norm in [norm for norm in (True, False) if trial < trials[norm]]:
                probs = [p.probability if norm else np.ones_like(p.probability) for p in picked]
                outputs, _ = _layer_outputs(clients, layer, index, probs)
                for i, out in enumerate(outputs):
                    first, second = moments[norm][i]
                    first[index[i]] += out.numpy()
                    second[index[i]] += out.numpy() ** 2
                    counts[norm][i][index[i]] += 1
    mean_z2 = {}
    for norm in (True, False):
        z2 = []
        for i in range(len(clients)):
            seen = counts[norm][i] >= min_seen[norm]
            k = counts[norm][i][seen][:, None]
            first, second = (m[seen] for m in moments[norm][i])
            mean = first / k
            variance = np.maximum(second / k - mean ** 2, 1e-30) * k / (k - 1)
            z2.append((mean - full[i].detach().numpy()[seen]) ** 2 / (variance / k))
        mean_z2[norm] = float(np.mean(np.concatenate(z2)))
    assert mean_z2[True] < 1.5, mean_z2
    assert mean_z2[False] > 10, mean_z2


def test_subgraph_norm_across_clients_is_one_gcn_layer_on_the_induced_subgraph(tmp_path):
    """--subgraph-norm over three clients: each sampled node's degree counts its sampled
    neighbours on every client (cross edges included), so the layer equals PyG's GCNConv, with
    its own normalisation, on the subgraph the union of the samples induces in the whole graph."""
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import from_scipy_sparse_matrix

    clients = _clients(tmp_path)
    layer = GCNLayer(5, 3).double()
    rng = np.random.default_rng(3)
    samples = [np.sort(rng.choice(c.num_nodes, c.num_nodes // 3, replace=False))
               for c in clients]
    probabilities = [rng.uniform(0.1, 1.0, index.shape[0]) for index in samples]  # ignored
    with torch.no_grad():
        outputs, _ = _layer_outputs(clients, layer, samples, probabilities, subgraph_degrees=True)
    merged = ClientGraph.merged([load_client_shard(tmp_path / "s" / shard_filename(i))
                                 for i in range(len(clients))])
    starts = np.cumsum([0] + [c.num_nodes for c in clients])
    sampled = np.concatenate([starts[i] + index for i, index in enumerate(samples)])
    induced = merged.inner[sampled][:, sampled]
    conv = GCNConv(5, 3).double()  # its own degrees, self loops and normalisation
    conv.lin.weight.data.copy_(layer.lin.weight.data)
    conv.bias.data.copy_(layer.bias.data)
    edge_index, _ = from_scipy_sparse_matrix(induced)
    x = torch.from_numpy(merged.x[sampled]).double()
    with torch.no_grad():
        expected = conv(x, edge_index)
    np.testing.assert_allclose(torch.cat(outputs).numpy(), expected.numpy(), atol=1e-12)


@pytest.mark.parametrize("n", [4, 10, 11, 13, 13752, 19717, 2449029, 10 ** 9 + 3])
def test_default_sample_gives_four_steps(n):
    """s = ceil(n / 4) gives exactly 4 steps for n = 4 and every n >= 10 (3 s < n). With
    s = floor(n / 4), ogbn-products (n = 2,449,029) has n / s = 4.0000016 and gave 5."""
    assert steps_for_sample(n, -(-n // 4)) == 4
    assert steps_for_sample(2449029, 2449029 // 4) == 5
    assert steps_for_sample(100, 100) == 1 and steps_for_sample(100, 30) == 4
    assert steps_for_sample(100, 1000) == 1


def test_the_community_note_speaks_only_for_a_label_sampler_nobody_chose_on_communities():
    from mpifgl.sampling import community_sampler_note
    note = community_sampler_note("louvain", "label", chosen=False)
    assert note.startswith("the shards' partition is louvain (communities)")
    assert "pass --sampling uniform" in note
    assert community_sampler_note("louvain", "label", chosen=True) is None
    assert community_sampler_note("louvain", "uniform", chosen=False) is None
    assert community_sampler_note("metis", "label", chosen=False).startswith(
        "the shards' partition is metis (communities)")
    for partition in ("random", "label-skew", "dirichlet", None):
        assert community_sampler_note(partition, "label", chosen=False) is None
