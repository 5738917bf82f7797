"""The test that matters most: the distributed model equals centralized training.

With no dropout, for 1-4 clients, logits, loss and every weight gradient of the MPI run equal
(1e-10 in float64, 1e-5 in float32) the program's own centralized mode, on the full graph and on
one fixed sample, and PyG's GCNConv / GraphConv given the same weights (full graph), for every
exchange mode, with the default buffers and with few-row chunks.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.exactness import (TINY_MB, assert_close, check_against_references, run_probe,
                                     two_islands_graph)
from tests.helpers.graphs import random_parts, write_shards


@pytest.mark.mpi
@pytest.mark.timeout(260)
@pytest.mark.parametrize("num_clients", [1, 2, 3, 4])
def test_distributed_equals_centralized_small_graph(toy_graph, tmp_path, num_clients):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=5),
                             tmp_path / "shards")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, num_clients + 1, 3)
    check_against_references(toy_graph, shard_dir, 3, out)


@pytest.mark.mpi
@pytest.mark.timeout(500)
@pytest.mark.parametrize("mode", ["compact", "compact-reduce", "reduce", "star"])
def test_every_exchange_mode_with_tiny_chunks_equals_centralized(toy_graph, tmp_path, mode):
    """Every mode computes centralized's model, whole and chunked (so star, Gather at the server
    summed there in client order, computes the Reduce exchange's); chunked equals whole bit for
    bit where the server sums (compact, star), to float rounding where MPI_Reduce does."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=5),
                             tmp_path / "shards")
    whole = run_probe(shard_dir, tmp_path / "whole.npz", 4, 2, mode)
    chunked = run_probe(shard_dir, tmp_path / "chunked.npz", 4, 2, mode, TINY_MB)
    for probe in ("whole.npz", "chunked.npz"):
        check_against_references(toy_graph, shard_dir, 2, tmp_path / probe)
    for key in whole.files:
        if mode in ("compact", "star"):
            np.testing.assert_array_equal(chunked[key], whole[key], err_msg=key)
        else:
            assert_close(chunked[key], whole[key], 1e-12 if "float64" in key else 1e-6, key)


@pytest.mark.mpi
@pytest.mark.timeout(260)
@pytest.mark.parametrize("mode,buffer_mb", [("compact", 256.0), ("compact", TINY_MB),
                                            ("compact-reduce", TINY_MB)])
def test_owner_that_receives_nothing(tmp_path, mode, buffer_mb):
    graph, parts = two_islands_graph()
    shard_dir = write_shards(graph, parts, tmp_path / "shards")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, 4, 2, mode, buffer_mb)
    check_against_references(graph, shard_dir, 2, out)

