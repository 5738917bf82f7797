"""mpifgl.methods.gnn without mpirun (ranks are threads, tests/helpers/thread_comm.py): the
distributed step equals the centralized one in every exchange mode, the server runs its side of
the schedule without a model, the sampler resolves the sample size and steps, the loss is
weighted by the global count of training rows, and a sample over capacity is refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.model import select_rows
from mpifgl.registry import BACKBONES, EXCHANGES
from mpifgl.sampling import NodeSample, NodeSampler
from tests.helpers.exactness import (TOLERANCE, assert_close, centralized_reference, fixed_sample,
                                     flat_grads, gather_in_global_order, operator_logits)
from tests.helpers.graphs import random_graph, random_parts, write_shards
from tests.helpers.thread_comm import ThreadWorld


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # ranks are threads


def config_for(shard_dir, **flags) -> TrainConfig:
    values = dict(shards=str(shard_dir), dtype="float64", dropout=0.0, sampling="none",
                  layers=2, hidden=16, seed=3)
    values.update(flags)
    return TrainConfig(**values)


def method_of(comm, shard_dir, config: TrainConfig):
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id)
    return build_trainer(config, comm, graph, manifest.num_classes).method, graph, manifest


def sampled_step_on_every_rank(shard_dir, config: TrainConfig, ranks: int = 4) -> list:
    """One step on the probe's fixed sample, ranks as threads: per rank (loss, flat gradients,
    the logits of the sample's rows gathered in global order)."""
    def body(comm):
        gnn, graph, manifest = method_of(comm, shard_dir, config)
        own = fixed_sample(manifest.client_sizes())[comm.client_id] if comm.is_client else None
        operator, train_rows = gnn.operator_for_sample(own)
        loss = gnn.loss_and_gradients(operator, train_rows)
        logits, _ = gather_in_global_order(
            comm, operator_logits(comm, gnn, operator, manifest.num_classes),
            graph.global_id[operator.rows.numpy()])
        return loss, flat_grads(gnn.model), logits

    return ThreadWorld(ranks).run(body)


@pytest.mark.parametrize("mode", list(EXCHANGES))
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_a_distributed_step_equals_the_centralized_one(toy_graph, tmp_path, mode, backbone):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=4),
                             tmp_path / "shards")
    config = config_for(shard_dir, exchange=mode, backbone=backbone)

    found = sampled_step_on_every_rank(shard_dir, config)
    expected = centralized_reference(shard_dir, backbone, "float64", 2, sampled=True)[:3]
    for name, a, b in zip(("loss", "grads", "logits"), found[0], expected):
        assert_close(a, b, TOLERANCE["float64"], f"{mode} {backbone} {name}")
    for loss, grads, _ in found[1:]:  # every rank holds the same loss and gradients
        assert loss == found[0][0] and np.array_equal(grads, found[0][1])


def test_the_server_runs_its_share_of_the_sums_and_no_model(toy_graph, tmp_path):
    """The server's step is the schedule's exchanges and the gradient sum; its evaluation
    returns no rows. Its optimizer steps like every client's, so every copy of the model stays
    the same."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 2, seed=1),
                             tmp_path / "shards")

    def body(comm):
        gnn, _, _ = method_of(comm, shard_dir, config_for(shard_dir, sampling="label",
                                                           dropout=0.2))
        losses = [gnn.train_step() for _ in range(3)]
        return losses, gnn.full_logits().shape, [p.detach().clone() for p in
                                                 gnn.model.parameters()]

    results = ThreadWorld(3).run(body)
    assert results[0][1] == (0, toy_graph.num_classes)
    assert results[1][1][0] + results[2][1][0] == toy_graph.num_nodes
    for losses, _, parameters in results[1:]:
        assert losses == results[0][0]
        assert all(torch.equal(a, b) for a, b in zip(parameters, results[0][2]))


def test_the_sampler_resolves_the_sample_size_and_steps(toy_graph, tmp_path):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 1), tmp_path / "s")
    n = toy_graph.num_nodes
    gnn, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir, sampling="label"))
    assert gnn.config.sample_size == -(-n // 4) and gnn.config.steps_per_epoch == 4
    gnn, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir, sampling="uniform",
                                                              sample_size=n // 2 + 1))
    assert gnn.config.steps_per_epoch == 2
    gnn, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir))
    assert gnn.sampler is None and gnn.config.steps_per_epoch == 1


def test_the_loss_is_the_sampled_cross_entropy_over_the_global_training_count(toy_graph,
                                                                             tmp_path):
    """sum of cross-entropies over the step's training rows / the GLOBAL count of such rows:
    with every node sampled, exactly the centralized mean cross-entropy."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 1), tmp_path / "s")
    gnn, graph, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir))
    index = np.arange(graph.num_nodes)
    operator, train_rows = gnn.operator_for_sample(NodeSample(index, np.ones(index.shape[0])))
    assert train_rows == int(graph.train_mask.sum())
    loss = gnn.loss_and_gradients(operator, train_rows)
    with torch.no_grad():
        gnn.model.eval()
        logits = gnn.model(gnn.x, gnn.full_operator)
    train = torch.from_numpy(graph.train_mask)
    expected = torch.nn.functional.cross_entropy(logits[train], gnn.setup.y[train])
    assert loss == pytest.approx(float(expected), rel=1e-12)


def test_a_sample_over_capacity_is_refused_naming_the_client(toy_graph, tmp_path):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 1), tmp_path / "s")
    gnn, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir, sampling="label",
                                                              sample_size=5))
    too_many = np.arange(gnn.sample_capacity() + 1)
    with pytest.raises(ValueError, match=f"a sample of {too_many.shape[0]} nodes on client 0, "
                                         f"expected at most {gnn.sample_capacity()}"):
        gnn.operator_for_sample(NodeSample(too_many, np.ones(too_many.shape[0])))


# -- --exact-first-layer ----------------------------------------------------------------------
def merged_sample(manifest) -> NodeSample:
    """The probe's fixed sample of every client, in the merged graph's client order."""
    samples = fixed_sample(manifest.client_sizes())
    starts = np.concatenate([[0], np.cumsum(manifest.client_sizes())])
    return NodeSample(np.concatenate([starts[j] + s.index for j, s in enumerate(samples)]),
                      np.concatenate([s.probability for s in samples]))


@pytest.mark.parametrize("backbone,secure,flags", [
    ("gcn", False, {"exact_first_layer": True}), ("1gnn", True, {"exact_first_layer": True}),
    ("gcn", False, {"subgraph_norm": True}), ("gcn", True, {"subgraph_norm": True})])
def test_a_sampled_variant_distributed_equals_centralized(toy_graph, tmp_path, backbone, secure,
                                                          flags):
    """A sampled step with the first layer's input aggregate computed at set-up (one masked
    exchange with --secure), or with the sample normalised as a graph of its own (each node's
    sampled degree counts its sampled neighbours on every client): every rank's loss, gradients
    and logits equal one process's."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=4),
                             tmp_path / "shards")
    config = config_for(shard_dir, backbone=backbone, secure=secure, **flags)
    manifest = read_manifest(shard_dir)
    found = sampled_step_on_every_rank(shard_dir, config)[0]
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(3)])
    gnn = build_trainer(config.replace(secure=False), LocalComm(), merged,
                        manifest.num_classes).method
    operator, train_rows = gnn.operator_for_sample(merged_sample(manifest))
    loss = gnn.loss_and_gradients(operator, train_rows)
    logits = operator_logits(LocalComm(), gnn, operator, manifest.num_classes)
    order = np.argsort(merged.global_id[operator.rows.numpy()])
    for name, a, b in zip(("loss", "grads", "logits"), found,
                          (loss, flat_grads(gnn.model), logits[order])):
        assert_close(a, b, TOLERANCE["float64"], f"{backbone} {flags} {name}")


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_the_exact_first_layer_is_the_full_graph_layer_on_the_sampled_rows(toy_graph, tmp_path,
                                                                         backbone):
    """Its output on a sample's rows is the full-graph first layer's, bit for bit in float64
    up to rounding (1e-12), and the full-graph model is the plain one; the sums it leaves per
    step are those of the layers above. GCN's self term is in the aggregate (one transform of
    their sum): its features are not kept; 1-GNN's root weight keeps them."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 1), tmp_path / "s")
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(0))])
    exact, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir, backbone=backbone,
                                                              exact_first_layer=True))
    plain, _, _ = method_of(LocalComm(), shard_dir, config_for(shard_dir, backbone=backbone))
    operator, _ = exact.operator_for_sample(merged_sample(manifest))
    first = exact.model.layers[0]
    with torch.no_grad():
        full = first(plain.x, plain.full_operator)
        sampled = (first.forward_folded(operator.input_aggregate) if backbone == "gcn" else
                   first.forward_aggregated(select_rows(exact.x, operator.rows),
                                            operator.input_aggregate, operator))
        torch.testing.assert_close(sampled, full[operator.rows], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(exact.full_logits(), plain.full_logits(), rtol=1e-12,
                                   atol=1e-12)
    assert graph.num_nodes == exact.input_aggregate.shape[0]
    assert operator.input_has_self == (backbone == "gcn") == (exact.x is None)


def sampled_logit_statistics(gnn, manifest, draws: int, rounds: int,
                             min_seen: int) -> tuple[float, float]:
    """Sampled 2-layer logits (eval mode) of ``rounds`` uniform samples of ``draws`` against the
    full-graph logits: (mean z^2, mean variance) over the entries of nodes seen >= ``min_seen``
    times that vary. z = (sample mean - full) / standard error: about 1 if unbiased (statistic
    as in test_sampling); an isolated node's logits are deterministic and must match."""
    full = gnn.full_logits().detach().numpy()
    n = full.shape[0]
    sampler = NodeSampler(np.full(n, 1.0 / n), draws, np.random.default_rng(5))
    first, second, counts = np.zeros_like(full), np.zeros_like(full), np.zeros(n)
    for _ in range(rounds):
        operator, _ = gnn.operator_for_sample(sampler.sample())
        rows = operator.rows.numpy()
        logits = operator_logits(LocalComm(), gnn, operator, manifest.num_classes)
        first[rows] += logits
        second[rows] += logits ** 2
        counts[rows] += 1
    seen = counts >= min_seen
    assert seen.mean() > 0.95
    k = counts[seen][:, None]
    mean = first[seen] / k
    variance = np.maximum(second[seen] / k - mean ** 2, 0.0) * k / (k - 1)
    varies = variance > 1e-20
    np.testing.assert_allclose(mean[~varies], full[seen][~varies], atol=1e-12)
    z2 = (mean - full[seen])[varies] ** 2 / (variance / k)[varies]
    return float(np.mean(z2)), float(np.mean(variance))


@pytest.mark.timeout(120)
def test_with_the_exact_first_layer_two_layers_of_logits_are_unbiased(tmp_path):
    """Averaged over many samples, a sampled node's 2-layer GCN logits (eval mode) converge to its
    full-graph logits when the first layer is exact: the only estimate left is the second
    layer's 1/p-scaled sum over exact first-layer outputs. With eq. 4 in both layers the ReLU of
    a noisy first layer biases them. Nodes seen >= 100 times in 800 samples; without the exact
    first layer z^2 grows with the samples, and its first 400 (nodes seen >= 50 times) give
    z^2 about 25. 600 nodes and 150 draws keep the conditional bias of drawing with
    replacement (order 1/s) inside."""
    graph = random_graph(n=600, avg_degree=5, d=7, classes=3, seed=11, isolated=2)
    shard_dir = write_shards(graph, random_parts(graph.num_nodes, 1), tmp_path / "s")
    mean_z2 = {}
    for exact_first in (True, False):
        gnn, _, manifest = method_of(LocalComm(), shard_dir, config_for(
            shard_dir, sampling="label", exact_first_layer=exact_first, hidden=8,
            sample_size=150))
        rounds, min_seen = (800, 100) if exact_first else (400, 50)
        mean_z2[exact_first] = sampled_logit_statistics(gnn, manifest, 150, rounds, min_seen)[0]
    assert mean_z2[True] < 1.5, mean_z2
    assert mean_z2[False] > 10, mean_z2


@pytest.mark.parametrize("algo", ["fedavg", "fedavg-nc", "graphsage", "graphsaint"])
def test_the_exact_first_layer_is_refused_where_the_whole_graph_model_is_not_trained(algo):
    with pytest.raises(ValueError, match=f"--exact-first-layer with --algo '{algo}': expected "
                                         "--algo one of ours, centralized, bns"):
        TrainConfig(algo=algo, exact_first_layer=True).validate()
    for allowed in ("ours", "centralized", "bns"):
        TrainConfig(algo=allowed, exact_first_layer=True).validate()


# -- --history-every: control variates from historical activations ---------------------------
def moved_weights(model) -> None:
    """The same small move of every weight on every rank: the history becomes stale."""
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.add_(0.05 * torch.sin(torch.arange(p.numel(), dtype=p.dtype) + k).view_as(p))


def history_step(gnn, sample: NodeSample | None):
    """Refresh the history, move the weights, one sampled step: (loss, gradients, operator)."""
    gnn.refresh_history()
    moved_weights(gnn.model)
    operator, train_rows = gnn.operator_for_sample(sample)
    loss = gnn.loss_and_gradients(operator, train_rows)
    return loss, flat_grads(gnn.model), operator


@pytest.mark.parametrize("backbone,secure", [("gcn", False), ("1gnn", True)])
def test_history_distributed_equals_centralized(toy_graph, tmp_path, backbone, secure):
    """A sampled 3-layer step with stale history (refreshed, then the weights moved): every
    rank's loss, gradients and logits equal one process's; --secure masks the refresh's
    exchanges too."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=4),
                             tmp_path / "shards")
    config = config_for(shard_dir, backbone=backbone, history_every=1, secure=secure, layers=3,
                        sampling="label", sample_size=toy_graph.num_nodes)  # room for the sample
    manifest = read_manifest(shard_dir)

    def body(comm):
        gnn, graph, _ = method_of(comm, shard_dir, config)
        own = fixed_sample(manifest.client_sizes())[comm.client_id] if comm.is_client else None
        loss, grads, operator = history_step(gnn, own)
        logits, _ = gather_in_global_order(
            comm, operator_logits(comm, gnn, operator, manifest.num_classes),
            graph.global_id[operator.rows.numpy()])
        return loss, grads, logits

    found = ThreadWorld(4).run(body)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(3)])
    gnn = build_trainer(config.replace(secure=False), LocalComm(), merged,
                        manifest.num_classes).method
    loss, grads, operator = history_step(gnn, merged_sample(manifest))
    logits = operator_logits(LocalComm(), gnn, operator, manifest.num_classes)
    order = np.argsort(merged.global_id[operator.rows.numpy()])
    for name, a, b in zip(("loss", "grads", "logits"), found[0], (loss, grads, logits[order])):
        assert_close(a, b, TOLERANCE["float64"], f"{backbone} {name}")
    for rank_loss, rank_grads, _ in found[1:]:
        assert rank_loss == found[0][0] and np.array_equal(rank_grads, found[0][1])


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_right_after_a_refresh_a_sample_gives_the_full_graph_logits(toy_graph, tmp_path,
                                                                    backbone):
    """With the history of the current weights the change is zero: a sample's logits (eval
    mode, 3 layers) are the full-graph model's on its rows up to rounding, however small the
    sample; the refresh itself is the full-graph forward."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 1), tmp_path / "s")
    manifest = read_manifest(shard_dir)
    gnn, _, _ = method_of(LocalComm(), shard_dir, config_for(
        shard_dir, backbone=backbone, history_every=1, layers=3, sampling="label",
        sample_size=toy_graph.num_nodes))
    gnn.refresh_history()
    full = gnn.full_logits()
    for keep in (0.6, 0.1):
        rng = np.random.default_rng(7)
        index = np.flatnonzero(rng.random(toy_graph.num_nodes) < keep)
        operator, _ = gnn.operator_for_sample(NodeSample(index, np.full(index.shape[0], keep)))
        logits = operator_logits(LocalComm(), gnn, operator, manifest.num_classes)
        np.testing.assert_allclose(logits, full[operator.rows].numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.timeout(120)
def test_stale_history_keeps_the_logits_unbiased_with_far_less_variance(tmp_path):
    """Averaged over many samples, a sampled node's 2-layer logits (eval mode) converge to its
    full-graph logits with stale history too (statistic of the exact-first-layer test above:
    mean z^2 about 1 if unbiased), and their variance is a small fraction of the exact first
    layer's alone, on the first half of the same samples (its mean variance is within 1% of
    the one over all of them): the sample estimates only the change since the refresh."""
    graph = random_graph(n=600, avg_degree=5, d=7, classes=3, seed=11, isolated=2)
    shard_dir = write_shards(graph, random_parts(graph.num_nodes, 1), tmp_path / "s")
    results = {}
    for history in (1, 0):
        gnn, _, manifest = method_of(LocalComm(), shard_dir, config_for(
            shard_dir, sampling="label", exact_first_layer=True, history_every=history,
            hidden=8, sample_size=150))
        if history:
            gnn.refresh_history()
        moved_weights(gnn.model)
        rounds, min_seen = (600, 75) if history else (300, 37)
        results[history] = sampled_logit_statistics(gnn, manifest, 150, rounds, min_seen)
    assert results[1][0] < 1.5, results
    assert results[1][1] < 0.1 * results[0][1], results


def test_history_every_is_refused_where_nothing_is_sampled():
    with pytest.raises(ValueError, match="--history-every with --sampling none: expected "
                                         "--sampling label or uniform"):
        TrainConfig(algo="centralized", sampling="none", history_every=2).validate()
    with pytest.raises(ValueError, match="--history-every with --algo 'fedavg': expected --algo "
                                         "one of ours, centralized, bns"):
        TrainConfig(algo="fedavg", history_every=2).validate()
    with pytest.raises(ValueError, match="--history-every is -1, expected an integer >= 0"):
        TrainConfig(history_every=-1).validate()
    TrainConfig(algo="centralized", sampling="label", history_every=2).validate()
    TrainConfig(algo="bns", sampling="none", history_every=2).validate()


@pytest.mark.parametrize("flags,named", [
    ({"no_normalize": True}, "--no-normalize"), ({"history_every": 5}, "--history-every 5"),
    ({"algo": "fedavg"}, "--algo fedavg"), ({"algo": "centralized", "sampling": "none"},
                                             "--sampling none")])
def test_subgraph_norm_is_refused_where_it_has_no_meaning(flags, named):
    with pytest.raises(ValueError, match=f"--subgraph-norm with {named}: expected node sampling"):
        TrainConfig(subgraph_norm=True, **flags).validate()
    TrainConfig(subgraph_norm=True).validate()
    TrainConfig(algo="bns", sampling="none", subgraph_norm=True).validate()
