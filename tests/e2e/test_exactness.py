"""The exactness check on real data: Cora split over 3 clients under mpirun equals the
centralized mode and PyG (tests/mpi/test_exactness.py has the small graphs)."""
from __future__ import annotations

import pytest

from tests.helpers.exactness import check_against_references, run_probe
from tests.helpers.graphs import random_parts, write_shards


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_clients", [3])
def test_distributed_equals_centralized_cora(cora_graph, tmp_path, num_clients):
    shard_dir = write_shards(cora_graph, random_parts(cora_graph.num_nodes, num_clients, seed=1),
                             tmp_path / "shards", dataset="cora")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, num_clients + 1, 2)
    check_against_references(cora_graph, shard_dir, 2, out)
