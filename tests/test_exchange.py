"""mpifgl.exchange: chunking, the plan's rows, steps per epoch, and the bytes a run records.

The exchange's numbers (distributed = centralized, chunked = whole) are tested in
test_exactness.py; here are its pieces without MPI and its byte counts under mpirun.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpi_util import run_mpi
from mpifgl.config import TrainConfig
from mpifgl.exchange import chunk_bounds, dense_terms
from mpifgl.graph import ClientGraph, build_operator
from mpifgl.sampling import steps_for_sample


def test_chunk_bounds_respect_the_budget_and_give_big_rows_their_own_chunk():
    cost = np.asarray([2, 2, 2, 5, 1, 1, 1, 9, 1])
    bounds = chunk_bounds(cost, 4)
    assert bounds.tolist() == [0, 2, 3, 4, 7, 8, 9]
    sums = [cost[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
    assert all(s <= 4 or b - a == 1 for s, a, b in zip(sums, bounds[:-1], bounds[1:]))
    assert chunk_bounds(cost, 100).tolist() == [0, 9]
    assert chunk_bounds(np.zeros(0, np.int64), 4).tolist() == [0]


@pytest.mark.parametrize("n", [4, 10, 11, 13, 13752, 19717, 2449029, 10 ** 9 + 3])
def test_default_sample_gives_four_steps(n):
    """s = ceil(n / 4) gives exactly 4 steps for n = 4 and every n >= 10 (3 s < n). With
    s = floor(n / 4),
    ogbn-products (n = 2,449,029) has n / s = 4.0000016 and gave 5."""
    assert steps_for_sample(n, -(-n // 4)) == 4
    assert steps_for_sample(2449029, 2449029 // 4) == 5
    assert steps_for_sample(100, 100) == 1 and steps_for_sample(100, 30) == 4
    assert steps_for_sample(100, 1000) == 1


def test_plan_rows_are_the_non_zero_rows_of_the_dense_terms(toy_shards):
    """A client's touched rows are exactly the non-zero rows of its dense terms, and an owner's
    receive rows exactly the rows of its segment some other client's terms reach."""
    shards = toy_shards(3, seed=1)
    manifest = read_manifest(shards)
    graphs = [ClientGraph.from_shard(load_client_shard(shards / shard_filename(i)),
                                     manifest.client_sizes()) for i in range(3)]
    rng = np.random.default_rng(0)
    for samples in (None, [np.sort(rng.choice(g.num_nodes, g.num_nodes // 2, replace=False))
                           for g in graphs]):
        plans = [build_operator(g, "gcn", samples, None, torch.float64, True).exchange
                 for g in graphs]
        sums = 0
        for graph, plan in zip(graphs, plans):
            y = torch.from_numpy(rng.random((plan.send_rows.shape[1], 4)) + 0.5)
            dense = dense_terms(plan, y).numpy()
            assert np.flatnonzero(np.abs(dense).sum(axis=1)).tolist() == plan.touched.tolist()
            sums = sums + (dense != 0)
        starts = np.concatenate([[0], np.cumsum(plans[0].segment_rows)])
        for j, plan in enumerate(plans):
            reached = np.flatnonzero(sums[starts[j]:starts[j + 1]].any(axis=1))
            assert reached.tolist() == plan.receive_rows.tolist()


def test_config_rejects_a_buffer_cap_that_is_not_positive():
    with pytest.raises(ValueError, match="--exchange-buffer-mb is 0.0, expected a positive"):
        TrainConfig(exchange_buffer_mb=0.0).validate()
    assert TrainConfig().exchange == "compact"


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("buffer_mb", ["256", "1e-6"])
def test_compact_exchange_bytes_are_the_non_zero_rows(toy_shards, tmp_path, buffer_mb):
    """Full-graph training (plan prepared before the epoch): each client's exchange_bytes_sent
    is exactly its touched rows' values (both directions of every layer, plus the evaluation's
    forward), whatever the chunking; the totals include them."""
    shards = toy_shards(3, seed=2)
    out = tmp_path / "run"
    done = run_mpi(4, ["-m", "mpifgl.train", "--shards", str(shards), "--out", str(out),
                       "--epochs", "1", "--sampling", "none", "--hidden", "8",
                       "--exchange-buffer-mb", buffer_mb], timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    manifest = read_manifest(shards)
    widths = 8 + manifest.num_classes  # two layers
    for i in range(3):
        graph = ClientGraph.from_shard(load_client_shard(shards / shard_filename(i)),
                                       manifest.client_sizes())
        plan = build_operator(graph, "gcn", None, None, torch.float32, True).exchange
        expected = plan.touched.shape[0] * widths * 4 * 3  # forward, backward, evaluation
        assert record["exchange_bytes_sent"][i + 1] == expected
        received = plan.receive_rows.shape[0] * widths * 4 * 3
        assert record["exchange_bytes_received"][i + 1] == received
        assert record["bytes_sent"][i + 1] > expected
    assert record["exchange_bytes_received"][0] == sum(record["exchange_bytes_sent"][1:])
