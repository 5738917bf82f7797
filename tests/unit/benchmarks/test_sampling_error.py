"""The estimator benchmark's one-process layers are the layers mpifgl trains (PyG's GCNConv and
SAGEConv on the same weights), its sampled operator over every node at p = 1 is the full one,
and its propagation's backward is the operator's transpose (the mean operator is not
symmetric)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from benchmarks.sampling_error import Graph, Net, Operator, Propagate


def random_graph(n: int = 30, edges: int = 80, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, edges), rng.integers(0, n, edges)
    # no self loops; node 0 isolated: SAGE's mean is empty there, GCN keeps its self loop
    keep = (rows != cols) & (rows != 0) & (cols != 0)
    adjacency = sp.coo_matrix((np.ones(keep.sum()), (rows[keep], cols[keep])), shape=(n, n))
    return ((adjacency + adjacency.T) > 0).astype(np.float32).tocsr()


def edge_index(adjacency: sp.csr_matrix) -> torch.Tensor:
    coo = adjacency.tocoo()
    return torch.from_numpy(np.vstack([coo.col, coo.row]).astype(np.int64))  # source -> target


@pytest.mark.parametrize("backbone", ["gcn", "sage"])
def test_first_layer_is_pyg_layer(backbone):
    from torch_geometric.nn import GCNConv, SAGEConv
    adjacency = random_graph()
    graph = Graph(adjacency, backbone)
    torch.manual_seed(0)
    model = Net([6, 5, 3], 0.0, graph.full, backbone).eval()
    x = torch.randn(adjacency.shape[0], 6)
    ours = model.preactivations(x, graph.full)[0]
    lin = model.lins[0]
    if backbone == "gcn":
        conv = GCNConv(6, 5)
        conv.lin.weight.data.copy_(lin.weight)
        conv.bias.data.copy_(lin.bias)
    else:
        conv = SAGEConv(6, 5, aggr="mean")
        conv.lin_l.weight.data.copy_(lin.weight)
        conv.lin_l.bias.data.copy_(lin.bias)
        conv.lin_r.weight.data.copy_(model.roots[0].weight)
    torch.testing.assert_close(ours, conv(x, edge_index(adjacency)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backbone", ["gcn", "sage"])
def test_every_node_at_p_one_is_the_full_operator(backbone):
    graph = Graph(random_graph(), backbone)
    every = np.arange(graph.n)
    full = graph.full.matrix
    assert abs(graph.sampled(every, 1.0).matrix - full).max() == 0
    # neighbours scaled by 1/p, the self term (GCN's loop) not
    half = graph.sampled(every, 0.5)
    off = sp.csr_matrix(full - sp.diags(full.diagonal()))
    np.testing.assert_allclose(half.matrix.toarray(), 2 * off.toarray() + np.diag(full.diagonal()),
                               rtol=1e-6)
    for operator in (graph.full, half):  # the backward's matrix is the transpose, as CSR
        assert operator.transpose.format == "csr"
        assert abs(operator.transpose - operator.matrix.T).max() == 0


def test_propagation_backward_is_the_transpose():
    graph = Graph(random_graph(), "sage")
    matrix = graph.full.matrix.astype(np.float64)
    assert abs(matrix - matrix.T).max() > 0  # the mean operator is not symmetric
    operator = Operator(matrix, matrix.T.tocsr())
    h = torch.randn(graph.n, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: Propagate.apply(t, operator), (h,))
