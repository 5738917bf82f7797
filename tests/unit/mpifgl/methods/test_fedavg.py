"""mpifgl.methods.fedavg: weighted averaging by hand-computed values, local graphs without the
cross-client edges (the mpirun runs are in tests/mpi/test_methods.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.methods.fedavg import fedavg_contribution, fedavg_result, local_graph
from mpifgl.graph import ClientGraph


def weighted_average(params_by_client: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """sum_i w_i p_i / sum_i w_i through the same two functions the MPI path uses."""
    summed = sum(fedavg_contribution(p, w, 0.0) for p, w in zip(params_by_client, weights))
    return fedavg_result(summed)[0]


def test_fedavg_weighted_average_hand_computed():
    a, b = torch.tensor([1.0, 2.0, -4.0]), torch.tensor([3.0, 0.0, 4.0])
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
