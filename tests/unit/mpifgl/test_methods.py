"""mpifgl.methods: the registry resolves each method's steps per epoch from the graph."""
from __future__ import annotations

import copy

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer


def resolver(shard_dir, **fixed):
    """(n, resolved): the merged graph's node count, and a function from flags to the config a
    one-process trainer on it settles (what config.json records)."""
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                 for i in range(manifest.num_clients)])

    def resolved(**flags) -> TrainConfig:
        config = TrainConfig(hidden=8, **fixed, **flags)
        # a copy: GCN's exact first layer releases the features of the graph it is given
        return build_trainer(config, LocalComm(), copy.copy(merged), manifest.num_classes).config

    return merged.num_nodes, resolved


def test_steps_per_epoch_zero_is_one_pass_for_ours_and_one_step_for_the_rest(toy_shards):
    """--steps-per-epoch 0 (the default): ours draws s = n/4 per step and takes ceil(n / s) = 4
    steps; an explicit value or another s changes it; without node sampling and for every
    baseline it is 1. The resolved values are what config.json records (trainer.config)."""
    n, resolved = resolver(toy_shards(2), batch_size=6)

    ours = resolved(algo="centralized", sampling="label")
    assert (ours.sample_size, ours.steps_per_epoch) == (round(n / 4), 4)
    assert resolved(algo="centralized", sampling="uniform", sample_size=n // 2 + 1) \
        .steps_per_epoch == 2
    assert resolved(algo="centralized", sampling="label", steps_per_epoch=3).steps_per_epoch == 3
    full = resolved(algo="centralized", sampling="none")
    assert (full.sample_size, full.steps_per_epoch) == (0, 1)
    for algo in ("graphsage", "graphsaint"):
        assert resolved(algo=algo).steps_per_epoch == 1, algo


def test_the_default_sample_is_a_quarter_up_to_20000_nodes_and_one_pass_in_one_step_above(
        toy_shards, monkeypatch):
    """--sample-size 0: ceil(n/4) draws and 4 steps per epoch up to LARGE_GRAPH_NODES (the
    paper's small graphs keep their scores), n draws in one step per epoch with the first layer
    exact above (GCN and 1-GNN layers); an explicit --sample-size is kept, and the first layer
    sampled. The toy graph stands in for a large one with the bound lowered."""
    from mpifgl import sampling
    assert sampling.default_sample_size(20_000, "gcn") == 5_000
    assert sampling.default_sample_size(20_001, "gcn") == 20_001
    assert sampling.default_sample_size(20_001, "1gnn") == 20_001
    assert sampling.default_sample_size(19_717, "gcn") == 4_930  # PubMed: the paper's 5,000
    n, resolved = resolver(toy_shards(2), algo="centralized", sampling="label")

    monkeypatch.setattr(sampling, "LARGE_GRAPH_NODES", n - 1)
    large = resolved()
    assert (large.sample_size, large.steps_per_epoch, large.exact_first_layer) == (n, 1, True)
    chosen = resolved(sample_size=15)
    assert (chosen.sample_size, chosen.steps_per_epoch, chosen.exact_first_layer) == (15, 4, False)
    monkeypatch.setattr(sampling, "LARGE_GRAPH_NODES", n)
    small = resolved()
    assert (small.sample_size, small.steps_per_epoch, small.exact_first_layer) == \
        (-(-n // 4), 4, False)


def test_the_default_sample_of_sage_layers_above_20000_nodes_is_the_papers_fifth(
        toy_shards, monkeypatch):
    """--backbone sage: n/4 up to LARGE_GRAPH_NODES as every layer; above, the paper's
    fraction, ceil(n/5) draws in 5 steps with the first layer sampled (eq. 4 as the paper ran
    it), unless --exact-first-layer is given."""
    from mpifgl import sampling
    assert sampling.default_sample_size(20_000, "sage") == 5_000
    assert sampling.default_sample_size(61_226, "sage") == 12_246  # the popularity proxy x0.025
    assert sampling.default_sample_size(2_449_029, "sage") == 489_806  # products (paper: 500,000)
    n, resolved = resolver(toy_shards(2), algo="ours", backbone="sage")

    monkeypatch.setattr(sampling, "LARGE_GRAPH_NODES", n - 1)
    large = resolved()
    assert (large.sample_size, large.steps_per_epoch, large.exact_first_layer) == \
        (-(-n // 5), 5, False)
    assert resolved(exact_first_layer=True).exact_first_layer
    monkeypatch.setattr(sampling, "LARGE_GRAPH_NODES", n)
    small = resolved()
    assert (small.sample_size, small.steps_per_epoch, small.exact_first_layer) == \
        (-(-n // 4), 4, False)
