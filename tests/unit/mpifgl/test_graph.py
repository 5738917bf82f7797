"""mpifgl.graph on a tiny hand-made graph: the propagation operators equal the dense formulas
and the cross-client plans hold exactly the cross terms: their rows are the non-zero rows of
the dense terms, and a sampled plan is the transpose of the sampled cross block."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.graph import ClientGraph, build_operator, sample_columns
from tests.helpers.exchange import dense_terms
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


def client_graphs(shard_dir) -> list[ClientGraph]:
    manifest = read_manifest(shard_dir)
    return [ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(i)),
                                   manifest.client_sizes()) for i in range(manifest.num_clients)]


def test_plan_rows_are_the_non_zero_rows_of_the_dense_terms(toy_shards):
    """A client's touched rows are exactly the non-zero rows of its dense terms, and an owner's
    receive rows exactly the rows of its segment some other client's terms reach."""
    graphs = client_graphs(toy_shards(3, seed=1))
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
        starts = plans[0].segment_start
        for j, plan in enumerate(plans):
            reached = np.flatnonzero(sums[starts[j]:starts[j + 1]].any(axis=1))
            assert reached.tolist() == plan.receive_rows.tolist()


def test_a_sampled_plan_is_the_transpose_of_the_sampled_cross_block(toy_shards):
    """Selected from the run's one transposed cross block, a step's plan holds the same rows,
    entries and values in the same order as transposing that step's cross block afresh, so
    its products are the same bits; so does the inner block's transpose (its backward)."""
    graphs = client_graphs(toy_shards(3, seed=2))
    rng = np.random.default_rng(3)
    for fraction in (1.0, 0.6, 0.2, 0.0):
        samples = [np.sort(rng.choice(g.num_nodes, int(g.num_nodes * fraction), replace=False))
                   for g in graphs]
        col_map, total = sample_columns(graphs[0], samples)
        for graph, rows in zip(graphs, samples):
            plan = build_operator(graph, "gcn", samples, None, torch.float32, True).exchange
            fresh = graph.cross.tocsr()[rows][:, np.flatnonzero(col_map >= 0)].T.tocsr()
            fresh.sort_indices()
            touched = np.flatnonzero(np.diff(fresh.indptr))
            fresh = fresh[touched]
            arrays = plan.send_rows.arrays
            assert plan.touched.tolist() == touched.tolist()
            assert arrays.shape == fresh.shape
            assert arrays.indptr.tolist() == fresh.indptr.tolist()
            assert arrays.indices.tolist() == fresh.indices.tolist()
            assert arrays.data.tobytes() == fresh.data.astype(np.float32).tobytes()
            with_edge = np.flatnonzero(np.diff(graph.cross.tocsr()[rows][:, col_map >= 0].indptr))
            assert plan.receive_rows.tolist() == with_edge.tolist()
            inner = build_operator(graph, "gcn", samples, None, torch.float32, True).inner
            fresh_inner = inner.forward_matrix.arrays.transpose().with_dtype(torch.float32)
            selected = inner.transpose_matrix.arrays
            for name in ("indptr", "indices"):
                assert getattr(selected, name).tolist() == getattr(fresh_inner, name).tolist()
            assert selected.data.tobytes() == fresh_inner.data.tobytes()
