"""mpifgl.methods.llcg: the K schedule, the sampled step against the full-graph forward and
against centralized GraphSAGE's step on the same sample, and a whole round (ranks as threads)
against an explicit loop of local steps, weighted averages and correction steps (the mpirun
runs are in tests/mpi/test_methods.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph, build_operator
from mpifgl.methods import build_trainer
from mpifgl.methods.fedavg import local_graph
from mpifgl.methods.llcg import (NeighbourSteps, SampledBatch, draw_seeds, local_steps_of_round,
                                 sampled_operator)
from mpifgl.methods.sampled import NeighbourSampler
from mpifgl.model import GNN, make_features
from mpifgl.optim import Adam
from mpifgl.trainer import RankSetup, dropout_stream
from tests.helpers.thread_comm import ThreadWorld


def shards_and_graphs(shard_dir, clients: int):
    manifest = read_manifest(shard_dir)
    shards = [load_client_shard(shard_dir / shard_filename(i)) for i in range(clients)]
    return manifest, shards, ClientGraph.merged(shards)


def test_the_schedule_is_the_references_ceil_of_k_over_rho_to_the_round():
    # the reference: int(np.ceil(local_updates / np.power(rho, epoch))), reversed with inc_k
    assert [local_steps_of_round(64, 1.1, r, 5) for r in range(5)] == [64, 59, 53, 49, 44]
    assert [local_steps_of_round(64, 1.1, r, 5, grow=True) for r in range(5)] == \
        [44, 49, 53, 59, 64]
    assert {local_steps_of_round(64, 1.0, r, 200) for r in range(200)} == {64}
    assert local_steps_of_round(64, 1.1, 100, 200) == 1  # 64 / 1.1^100 < 1: one step
    assert local_steps_of_round(64, 1.1, 10 ** 6, 10 ** 6 + 1) == 1  # 1.1^r past float range


def test_seeds_are_drawn_with_replacement_and_counted():
    pool = np.asarray([3, 7, 9])
    seeds, counts = draw_seeds(pool, 1000, np.random.default_rng(0))
    assert np.array_equal(seeds, pool) and counts.sum() == 1000
    assert np.all(np.abs(counts / 1000 - 1 / 3) < 0.06)


@pytest.mark.parametrize("backbone", ["gcn", "1gnn", "sage"])
def test_a_sample_of_every_neighbour_is_the_full_graph_forward_at_its_seeds(toy_shards,
                                                                            backbone):
    """d_v / c_v is 1 when every neighbour is sampled: the seeds' logits are the whole graph's
    (two hops of neighbours, all of them, for two layers)."""
    _, _, merged = shards_and_graphs(toy_shards(2), 2)
    model = GNN(backbone, merged.x.shape[1], 8, 3, 2, 0.0, 0, torch.float64)
    x = torch.from_numpy(np.asarray(merged.x, np.float64))
    full = model(x, build_operator(merged, backbone, None, None, torch.float64, False))
    sampler = NeighbourSampler(merged.inner.tocsr(), [1000, 1000], np.random.default_rng(1))
    seeds = np.random.default_rng(2).choice(merged.num_nodes, 9, replace=False)
    sample = sampler.sample(np.sort(seeds))
    operator = sampled_operator(sample, merged.degree, backbone, torch.float64)
    logits = model(x[torch.from_numpy(sample.nodes)], operator)
    assert torch.allclose(logits[:9], full[torch.from_numpy(np.sort(seeds))], atol=1e-12, rtol=0)


def test_a_partial_sample_scales_each_neighbour_sum_by_degree_over_sampled(toy_shards):
    _, _, merged = shards_and_graphs(toy_shards(2), 2)
    sample = NeighbourSampler(merged.inner.tocsr(), [2, 2],
                              np.random.default_rng(3)).sample(np.arange(5))
    operator = sampled_operator(sample, merged.degree, "sage", torch.float64)
    sampled = np.bincount(sample.edge_index[1], minlength=sample.nodes.shape[0])
    expected = np.where(sampled > 0, 1.0 / np.maximum(sampled, 1), 0.0)  # SAGE: the sampled mean
    assert np.allclose(operator.row_scale[:, 0].numpy(), expected, atol=1e-15)
    assert np.all(sampled[:5] == np.minimum(merged.degree[:5], 2))


def test_the_correction_step_is_centralized_graphsages_step_on_the_same_sample(toy_shards):
    """The server's step on the whole graph with GraphSAGE-mean equals ``--algo graphsage``'s
    step (PyG SAGEConv, trimmed layers) on the same neighbour sample of training seeds: the same
    loss and, after one Adam step at the same learning rate, the same weights (1e-12)."""
    shard_dir = toy_shards(2)
    manifest, _, merged = shards_and_graphs(shard_dir, 2)
    config = TrainConfig(algo="llcg", backbone="sage", dtype="float64", hidden=8, dropout=0.0,
                         fanouts=(3, 2), llcg_server_lr=0.05, feature_format="dense")
    llcg = build_trainer(config, LocalComm(), merged, manifest.num_classes,
                         whole_graph=merged).method
    sage = build_trainer(config.replace(algo="graphsage", lr=0.05), LocalComm(), merged,
                         manifest.num_classes).method
    sage.model.load_state_dict(llcg.model.state_dict())
    seeds = np.flatnonzero(merged.train_mask)[:6]
    sample = NeighbourSampler(merged.inner.tocsr(), [3, 2], np.random.default_rng(5)).sample(seeds)
    batch = SampledBatch(sample, sampled_operator(sample, merged.degree, "sage", torch.float64),
                         np.ones(seeds.shape[0]))
    ours = llcg.steps.step(llcg.model, llcg.optimizer, batch)
    theirs = sage.step(sample.nodes, sample.layer_adjacencies(torch.float64), seeds.shape[0],
                       None)
    assert ours == pytest.approx(theirs, abs=1e-12)
    reference = sage.model.state_dict()
    for name, value in llcg.model.state_dict().items():
        assert torch.allclose(value, reference[name], atol=1e-12, rtol=0), name


def test_a_drawn_node_weighs_as_often_as_it_was_drawn(toy_shards):
    """The loss is the mean over the DRAWS that are training nodes: a seed drawn three times
    counts three times, a non-training seed not at all."""
    shard_dir = toy_shards(1)
    manifest, _, merged = shards_and_graphs(shard_dir, 1)
    config = TrainConfig(algo="llcg", dtype="float64", hidden=8, dropout=0.0, fanouts=(2, 2))
    llcg = build_trainer(config, LocalComm(), merged, manifest.num_classes,
                         whole_graph=merged).method
    train, other = np.flatnonzero(merged.train_mask)[:2], np.flatnonzero(~merged.train_mask)[:1]
    seeds = np.sort(np.concatenate([train, other]))
    sample = NeighbourSampler(merged.inner.tocsr(), [2, 2], np.random.default_rng(0)).sample(seeds)
    weight = np.where(np.isin(seeds, train), np.where(seeds == train[0], 3.0, 1.0), 0.0)
    operator = sampled_operator(sample, merged.degree, "gcn", torch.float64)
    with torch.no_grad():
        logits = llcg.model(llcg.x[torch.from_numpy(sample.nodes)], operator)
    losses = torch.nn.functional.cross_entropy(logits[:seeds.shape[0]], llcg.y[seeds],
                                               reduction="none").numpy()
    expected = float((losses * weight).sum() / weight.sum())
    assert llcg.steps.step(llcg.model, llcg.optimizer, SampledBatch(sample, operator, weight)) \
        == pytest.approx(expected, abs=1e-12)


# -- a whole round: ranks as threads against an explicit loop -------------------------------------


def rank_streams(seed: int, rank: int):
    """The sampling and dropout streams RankSetup.create gives ``rank`` (CPU)."""
    state = np.random.SeedSequence([seed, rank]).generate_state(2)
    return np.random.default_rng(int(state[0])), dropout_stream(int(state[1]), torch.device("cpu"))


def run_llcg_threads(config: TrainConfig, shard_dir, clients: int, rounds: int):
    manifest, shards, merged = shards_and_graphs(shard_dir, clients)
    sizes = manifest.client_sizes()

    def body(comm):
        if comm.is_server:
            graph, whole = ClientGraph.empty(sizes, manifest.num_features), merged
        else:
            graph, whole = ClientGraph.from_shard(shards[comm.client_id], sizes), None
        method = build_trainer(config, comm, graph, manifest.num_classes,
                               whole_graph=whole).method
        losses = [method.train_step() for _ in range(rounds)]
        return [p.detach().clone() for p in method.model.parameters()], losses

    return ThreadWorld(clients + 1).run(body)


def explicit_llcg(config: TrainConfig, shard_dir, clients: int, rounds: int):
    """The same rounds written out: K_r local steps on each client's local graph with its own
    Adam, the training-size-weighted average of weights (and of Adam's moments), S correction
    steps at the server on the whole graph, every client continuing from the server's model."""
    manifest, shards, merged = shards_and_graphs(shard_dir, clients)
    sizes = manifest.client_sizes()

    def party(graph: ClientGraph, rank: int, lr: float, batch: int):
        sample_rng, dropout_rng = rank_streams(config.seed, rank)
        setup = RankSetup(config, None, graph, manifest.num_classes, torch.float64,
                          torch.from_numpy(graph.y.astype(np.int64)), {}, np.zeros(0),
                          np.zeros(0), {}, sample_rng, dropout_rng)
        model = GNN(config.backbone, graph.x.shape[1], config.hidden, manifest.num_classes,
                    config.layers, config.dropout, config.weight_seed, torch.float64)
        x = make_features(graph.x, torch.float64, config.feature_format)
        return (model, Adam(model.parameters(), lr=lr),
                NeighbourSteps(graph, x, setup.y, setup, batch))

    locals_ = [local_graph(ClientGraph.from_shard(shards[i], sizes)).graph
               for i in range(clients)]
    parties = [party(g, i + 1, config.lr, config.batch_size) for i, g in enumerate(locals_)]
    server_model, server_adam, server_steps = party(
        merged, 0, config.llcg_server_lr, config.llcg_server_batch_size or config.batch_size)
    weights = [float(g.train_mask.sum()) for g in locals_]
    losses = []
    for r in range(rounds):
        k = math.ceil(config.llcg_local_steps / config.llcg_rho ** r)
        round_losses = [steps.run(model, adam, k) for model, adam, steps in parties]
        losses.append(sum(w * v for w, v in zip(weights, round_losses)) / sum(weights))

        def mean(values):
            return sum(w * v.to(torch.float64) for w, v in zip(weights, values)) / sum(weights)

        with torch.no_grad():
            for j, p in enumerate(server_model.parameters()):
                p.copy_(mean([list(m.parameters())[j] for m, _, _ in parties]))
                server_adam.exp_avg[j].copy_(mean([a.exp_avg[j] for _, a, _ in parties]))
                server_adam.exp_avg_sq[j].copy_(mean([a.exp_avg_sq[j] for _, a, _ in parties]))
        server_adam.step_count = round(sum(w * a.step_count for w, (_, a, _) in
                                           zip(weights, parties)) / sum(weights))
        server_steps.run(server_model, server_adam, config.llcg_server_steps)
        with torch.no_grad():
            for model, _, _ in parties:
                for mine, theirs in zip(model.parameters(), server_model.parameters()):
                    mine.copy_(theirs)
    return [p.detach().clone() for p in server_model.parameters()], losses


@pytest.mark.parametrize("server_steps", [0, 2])
def test_rounds_are_local_steps_averaged_then_corrected(toy_shards, server_steps):
    """S = 0: periodic averaging of the same local steps (the server's moments play no part);
    S = 2: then two correction steps from the averaged Adam moments. Every rank ends with the
    explicit loop's weights, and the loss is the weighted mean of the clients' local losses."""
    shard_dir = toy_shards(2)
    config = TrainConfig(algo="llcg", dtype="float64", hidden=8, dropout=0.2, fanouts=(3, 2),
                         batch_size=12, llcg_local_steps=3, llcg_rho=1.5,
                         llcg_server_steps=server_steps, llcg_server_lr=0.02,
                         feature_format="dense")
    threads = run_llcg_threads(config, shard_dir, 2, rounds=3)
    expected, expected_losses = explicit_llcg(config, shard_dir, 2, rounds=3)
    for rank, (parameters, losses) in enumerate(threads):
        assert np.allclose(losses, expected_losses, atol=1e-12, rtol=0), rank
        for mine, theirs in zip(parameters, expected):
            assert torch.allclose(mine, theirs, atol=1e-12, rtol=0), rank
