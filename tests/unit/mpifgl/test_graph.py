"""mpifgl.graph on a tiny hand-made graph: the propagation operators equal the dense formulas
and the cross-client plans hold exactly the cross terms."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fgl_common.shard_format import load_client_shard, shard_filename
from mpifgl.graph import ClientGraph, build_operator, sample_columns
from tests.helpers.graphs import Graph, write_shards

# 0 - 1 - 2 - 3 - 4 and 1 - 3, node 5 isolated; clients: {0, 1, 5} and {2, 3, 4}
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (1, 3)]
PARTS = np.array([0, 0, 1, 1, 1, 0])


def hand_made_graph() -> Graph:
    n = 6
    rows, cols = zip(*EDGES)
    adj = sp.coo_matrix((np.ones(2 * len(EDGES), np.float32), (rows + cols, cols + rows)),
                        shape=(n, n)).tocsr()
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    masks = [np.array(m, bool) for m in ([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0],
                                         [0, 0, 0, 0, 1, 1])]
    return Graph(adj, x, np.array([0, 1, 0, 1, 0, 1]), *masks)


def shard_graphs(tmp_path) -> tuple[Graph, list, ClientGraph]:
    graph = hand_made_graph()
    shard_dir = write_shards(graph, PARTS, tmp_path / "shards")
    shards = [load_client_shard(shard_dir / shard_filename(i)) for i in range(2)]
    return graph, shards, ClientGraph.merged(shards)


def dense_propagation(adj: np.ndarray, y: np.ndarray, backbone: str) -> np.ndarray:
    """The whole-graph layer propagation written densely: GCN's D~^-1/2 (A + I) D~^-1/2 y,
    1-GNN's A y (its root term has its own weight, outside the operator)."""
    if backbone == "1gnn":
        return adj @ y
    d = 1.0 / np.sqrt(adj.sum(axis=1) + 1.0)
    return (d[:, None] * (adj + np.eye(adj.shape[0])) * d[None, :]) @ y


def apply(op, y: np.ndarray) -> np.ndarray:
    """row_scale * (inner @ (col_scale * y)) + self_scale * y, as the layers apply it."""
    y = torch.from_numpy(y)
    return (op.row_scale * (op.inner @ (op.col_scale * y)) + op.self_scale * y).numpy()


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_full_graph_operator_is_the_dense_formula(tmp_path, backbone):
    graph, _, merged = shard_graphs(tmp_path)
    op = build_operator(merged, backbone, None, None, torch.float64, exchanged=False)
    assert op.exchange is None and op.rows.tolist() == list(range(6))
    y = np.random.default_rng(0).standard_normal((6, 3))
    order = merged.global_id  # merged rows are in client order
    adj = graph.adj.toarray().astype(np.float64)[np.ix_(order, order)]
    np.testing.assert_allclose(apply(op, y), dense_propagation(adj, y, backbone), atol=1e-12)


def test_sampled_operator_scales_columns_by_one_over_p_and_keeps_whole_graph_degrees(tmp_path):
    graph, _, merged = shard_graphs(tmp_path)
    rows = np.array([0, 2, 3])
    p = np.array([0.5, 0.25, 1.0])
    op = build_operator(merged, "gcn", [rows], p, torch.float64, exchanged=False)
    order = merged.global_id
    adj = graph.adj.toarray().astype(np.float64)[np.ix_(order, order)]
    d = 1.0 / np.sqrt(adj.sum(axis=1) + 1.0)[rows]  # whole-graph degree, not the sample's
    np.testing.assert_array_equal((op.inner @ torch.eye(3, dtype=torch.float64)).numpy(),
                                  adj[np.ix_(rows, rows)])
    np.testing.assert_allclose(op.row_scale.numpy().ravel(), d)
    np.testing.assert_allclose(op.col_scale.numpy().ravel(), d / p)
    np.testing.assert_allclose(op.self_scale.numpy().ravel(), d * d)


def test_subgraph_norm_operator_is_the_gcn_of_the_induced_subgraph(tmp_path):
    """--subgraph-norm: the sample's own degrees, p ignored: GCN's dense formula applied to the
    induced subgraph A[S, S] as a graph of its own."""
    graph, _, merged = shard_graphs(tmp_path)
    rows = np.array([0, 2, 3, 4])
    p = np.array([0.5, 0.25, 1.0, 0.1])
    op = build_operator(merged, "gcn", [rows], p, torch.float64, exchanged=False,
                        subgraph_degrees=True)
    order = merged.global_id
    adj = graph.adj.toarray().astype(np.float64)[np.ix_(order, order)][np.ix_(rows, rows)]
    y = np.random.default_rng(1).standard_normal((4, 3))
    np.testing.assert_allclose(apply(op, y), dense_propagation(adj, y, "gcn"), atol=1e-12)
    d = 1.0 / np.sqrt(adj.sum(axis=1) + 1.0)
    np.testing.assert_allclose(op.col_scale.numpy().ravel(), d)


def test_unknown_backbone_is_named(tmp_path):
    _, _, merged = shard_graphs(tmp_path)
    with pytest.raises(ValueError, match="--backbone 'gat', expected one of gcn, 1gnn"):
        build_operator(merged, "gat", None, None, torch.float64, exchanged=False)


def test_client_graphs_split_the_adjacency_into_inner_and_cross_blocks(tmp_path):
    graph, shards, merged = shard_graphs(tmp_path)
    clients = [ClientGraph.from_shard(s, [3, 3]) for s in shards]
    order = merged.global_id
    adj = graph.adj.toarray()[np.ix_(order, order)]
    for i, client in enumerate(clients):
        own = slice(3 * i, 3 * i + 3)
        np.testing.assert_array_equal(client.inner.toarray(), adj[own, own])
        expected_cross = adj[own].copy()
        expected_cross[:, own] = 0
        np.testing.assert_array_equal(client.cross.toarray(), expected_cross)
        np.testing.assert_array_equal(client.degree,
                                      graph.adj.toarray().sum(axis=1)[client.global_id])
    assert clients[0].offsets.tolist() == [0, 3, 6]


def test_exchange_plan_holds_exactly_the_cross_terms(tmp_path):
    """Client i sends (A_i,cross)^T y_i on its touched rows only; summed over clients, each
    client's segment is sum_j A_ij y_j, non-zero on its receive rows only."""
    graph, shards, merged = shard_graphs(tmp_path)
    clients = [ClientGraph.from_shard(s, [3, 3]) for s in shards]
    rng = np.random.default_rng(1)
    ys = [rng.standard_normal((3, 2)) for _ in clients]
    total = np.zeros((6, 2))
    for client, y in zip(clients, ys):
        op = build_operator(client, "1gnn", None, None, torch.float64, exchanged=True)
        plan = op.exchange
        assert plan.segment_rows.tolist() == [3, 3] and plan.own_segment == client.client_id
        cross = client.cross.toarray()
        assert plan.touched.tolist() == np.flatnonzero(cross.any(axis=0)).tolist()
        assert plan.receive_rows.tolist() == np.flatnonzero(cross.any(axis=1)).tolist()
        sent = plan.send_rows.matmul(torch.from_numpy(y)).numpy()
        np.testing.assert_allclose(sent, (cross.T @ y)[plan.touched])
        total[plan.touched] += sent
        client.release_cross_block()  # plans select from the transpose: the same sums after
        assert "cross" not in client.__dict__ and "cross_arrays" not in client.__dict__
        rebuilt = client.cross  # read again: the same matrix, rebuilt from the transpose
        assert rebuilt.has_sorted_indices and rebuilt.dtype == np.float32
        np.testing.assert_array_equal(rebuilt.toarray(), cross)
        again = build_operator(client, "1gnn", None, None, torch.float64, exchanged=True)
        assert again.exchange.send_rows.arrays.unit
        np.testing.assert_array_equal(again.exchange.send_rows.matmul(torch.from_numpy(y)).numpy(),
                                      sent)
    order = merged.global_id
    adj = graph.adj.toarray()[np.ix_(order, order)]
    stacked = np.vstack(ys)
    for i in range(2):
        own = slice(3 * i, 3 * i + 3)
        cross_sum = adj[own] @ stacked - adj[own, own] @ stacked[own]
        np.testing.assert_allclose(total[own], cross_sum)


def test_sample_columns_and_the_servers_operator():
    sizes = [3, 2, 4]
    graph = ClientGraph.empty(sizes, num_features=5)
    col_map, total = sample_columns(graph, [np.array([0, 2]), np.array([], np.int64),
                                            np.array([1, 3])])
    assert total == 4
    assert col_map.tolist() == [0, -1, 1, -1, -1, -1, 2, -1, 3]
    op = build_operator(graph, "gcn", None, None, torch.float32, exchanged=True)
    assert op.rows.shape == (0,) and op.exchange.own_segment == -1
    assert op.exchange.segment_rows.tolist() == sizes and op.exchange.send_rows is None
