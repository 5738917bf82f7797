"""mpifgl.exchange without mpirun: every mode of the registry, run by threads through ThreadComm
(tests/helpers/thread_comm.py), gives each owner the sum of the other clients' terms for its
rows, whole and in chunks, sampled or not, with a client that touches nothing; the server's sums
add in client order; the hooks follow one schedule on every rank. The bytes a real run records
are checked under mpirun (tests/mpi/test_exchange.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.arrays import offsets
from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.config import TrainConfig
from mpifgl.exchange import CrossClientSums, build_exchange, chunk_bounds
from mpifgl.exchange.compact import _server_routing, _stable_order
from mpifgl.graph import ClientGraph, CrossExchangePlan, build_operator, sample_columns
from mpifgl.model import GNN
from mpifgl.registry import EXCHANGES
from mpifgl.sampling import steps_for_sample
from tests.helpers.exactness import two_islands_graph
from tests.helpers.exchange import dense_terms
from tests.helpers.graphs import write_shards
from tests.helpers.thread_comm import ThreadWorld

SLOT = ("train", "forward", 0)
# one float64 row of width 5 per chunk where a chunk holds at least one row
ONE_ROW_MB = 1e-6


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
    s = floor(n / 4), ogbn-products (n = 2,449,029) has n / s = 4.0000016 and gave 5."""
    assert steps_for_sample(n, -(-n // 4)) == 4
    assert steps_for_sample(2449029, 2449029 // 4) == 5
    assert steps_for_sample(100, 100) == 1 and steps_for_sample(100, 30) == 4
    assert steps_for_sample(100, 1000) == 1


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


def islands_shards(tmp_path):
    """Three clients; client 2 holds a component of its own: it sends and receives nothing."""
    graph, parts = two_islands_graph()
    return write_shards(graph, parts, tmp_path / "islands")


def run_exchange(shard_dir, mode: str, buffer_mb: float, samples, width: int = 5,
                 wire_dtype=None, world=None):
    """Every rank's exchange of ``mode`` on its plan: per client (result, y, plan), from
    ThreadWorld ranks; the server's own result is [0, width]."""
    manifest = read_manifest(shard_dir)
    sizes = manifest.client_sizes()

    def body(comm):
        graph = (ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id))
        exchange = build_exchange(comm, mode, int(buffer_mb * 2 ** 20), width, torch.float64,
                                  wire_dtype=wire_dtype)
        plan = build_operator(graph, "gcn", samples, None, torch.float64, True).exchange
        exchange.prepare(plan)
        rows = plan.send_rows.shape[1] if plan.send_rows is not None else 0
        y = torch.from_numpy(np.random.default_rng(comm.rank).normal(size=(rows, width)))
        result = exchange.run(plan, y, SLOT)
        added = exchange.run(plan, y, SLOT, total=torch.ones_like(y))
        return result, added, y, plan, plan.routing.num_chunks

    return (world or ThreadWorld(len(sizes) + 1)).run(body)


def expected_sums(results) -> list[np.ndarray]:
    """Each client's own segment of the sum over OTHER clients of their dense terms."""
    clients = results[1:]
    starts = clients[0][3].segment_start
    sums = []
    for j in range(len(clients)):
        total = sum(dense_terms(plan, y).numpy() for i, (_, _, y, plan, _) in enumerate(clients)
                    if i != j)
        sums.append(total[starts[j]:starts[j + 1]])
    return sums


@pytest.mark.parametrize("mode", list(EXCHANGES))
@pytest.mark.parametrize("buffer_mb", [64.0, ONE_ROW_MB])
@pytest.mark.parametrize("sampled", [False, True])
def test_every_mode_gives_each_owner_the_other_clients_terms(tmp_path, mode, buffer_mb, sampled):
    shard_dir = islands_shards(tmp_path)
    sizes = read_manifest(shard_dir).client_sizes()
    rng = np.random.default_rng(4)
    samples = ([np.sort(rng.choice(n, (2 * n) // 3, replace=False)) for n in sizes]
               if sampled else None)
    results = run_exchange(shard_dir, mode, buffer_mb, samples)
    assert results[0][0].shape == (0, 5)  # the server holds no rows
    for (result, added, _, plan, chunks), expected in zip(results[1:], expected_sums(results)):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(added.numpy(), expected + 1.0, rtol=1e-12, atol=1e-12)
        assert not np.any(np.delete(result.numpy(), plan.receive_rows, axis=0))
    islander = results[3]
    assert islander[3].touched.size == 0 and islander[3].receive_rows.size == 0
    assert not islander[0].numpy().any()
    if buffer_mb == ONE_ROW_MB:  # one row per chunk: as many chunks as summed rows
        assert results[1][4] > 1


def test_the_servers_sums_add_in_client_order_in_every_gathering_mode(tmp_path):
    """compact and star sum at the server in client order from zero: bit for bit the same."""
    shard_dir = islands_shards(tmp_path)
    compact, star = (run_exchange(shard_dir, mode, 64.0, None) for mode in ("compact", "star"))
    for a, b in zip(compact[1:], star[1:]):
        assert torch.equal(a[0], b[0])


def test_an_unknown_mode_and_a_mode_secure_cannot_mask_are_named():
    from tests.helpers.thread_comm import ThreadComm
    comm = ThreadComm(ThreadWorld(2), 1)
    with pytest.raises(ValueError, match="--exchange 'mesh', expected one of compact, "
                                         "compact-reduce, reduce, star"):
        build_exchange(comm, "mesh", 1 << 20, 4, torch.float32)
    with pytest.raises(ValueError, match="--secure with --exchange 'star': expected --exchange "
                                         "one of compact"):
        build_exchange(comm, "star", 1 << 20, 4, torch.float32, masking=object())


def test_config_rejects_a_buffer_cap_that_is_not_positive():
    with pytest.raises(ValueError, match="--exchange-buffer-mb is 0.0, expected a positive"):
        TrainConfig(exchange_buffer_mb=0.0).validate()
    assert TrainConfig().exchange == "compact"


def test_the_schedule_is_recorded_from_the_layers_and_its_order_is_enforced(tmp_path):
    """Every propagation registers its width once, in forward order; a forward and backward pass
    run the sums 0..L-1 then L-1..0 (the server's pass follows the same list); a sum out of that
    order is an error naming both, not a silent mismatch of collectives."""
    model = GNN("gcn", 6, 4, 3, 3, 0.0, seed=0)

    class Recording:
        dtype = torch.float32

        def __init__(self):
            self.calls = []

        def run(self, plan, y, slot, total=None):
            self.calls.append((slot, y.shape[1]))
            return torch.zeros_like(y) if total is None else total

    exchange = Recording()
    sums = CrossClientSums(exchange)
    sums.attach(model)
    assert sums.widths == [4, 4, 3]
    assert [len(layer.cross_sums) for layer in model.layers] == [1, 1, 1]
    sums.start_pass("train")
    sums.server_pass(plan=None, backward=True)
    assert exchange.calls == [(("train", "forward", k), w) for k, w in enumerate([4, 4, 3])] + \
        [(("train", "backward", k), w) for k, w in reversed(list(enumerate([4, 4, 3])))]
    sums.start_pass("eval")
    sums.run(None, torch.zeros(0, 4), "forward", 0)
    with pytest.raises(RuntimeError, match="cross-client sum 2 ran forward where sum 1"):
        sums.run(None, torch.zeros(0, 3), "forward", 2)


def sorted_runs(rng, total: int, runs: int) -> list[np.ndarray]:
    """Ascending distinct ids in [0, total) per sender, one sender touching nothing."""
    return [np.sort(rng.choice(total, int(rng.integers(1, total // 2)), replace=False))
            if j != 1 else np.zeros(0, np.int64) for j in range(runs)]


def test_the_counting_sort_of_the_sum_matrices_is_the_stable_sort():
    rng = np.random.default_rng(7)
    runs = sorted_runs(rng, 200, 5)
    target = np.concatenate(runs)
    indptr = offsets(np.bincount(target, minlength=200))
    order = _stable_order(target, np.asarray([r.shape[0] for r in runs]), indptr)
    np.testing.assert_array_equal(order, np.argsort(target, kind="stable"))


def test_the_servers_routing_counts_as_a_sort_would_and_refuses_bad_ids():
    """U, the senders per row and every sender's rows in U: what np.unique and searchsorted
    give; ids out of order, repeated or out of range are an inconsistency, not a wrong sum."""
    rng = np.random.default_rng(8)
    segment_rows = np.asarray([60, 50, 90])
    plan = CrossExchangePlan.of_server(segment_rows)
    ids = sorted_runs(rng, int(segment_rows.sum()), 3)
    union, senders = np.unique(np.concatenate(ids), return_counts=True)
    owner = np.searchsorted(plan.segment_start, union, side="right") - 1
    receive = np.bincount(owner, minlength=3)
    bounds, rows, cuts = _server_routing([[s] for s in ids], plan, receive, 7, gathered=True)
    for s, r in zip(ids, rows):
        np.testing.assert_array_equal(r, np.searchsorted(union, s))
    row_bounds = chunk_bounds(senders + 1, 7)
    np.testing.assert_array_equal(bounds, np.concatenate(
        [np.append(union[row_bounds[:-1]], 200), row_bounds]))
    np.testing.assert_array_equal(cuts, np.stack([np.searchsorted(r, row_bounds) for r in rows]))
    ids[0][0] = 0  # so that ids - 1 reaches below 0
    for bad in (ids[0][::-1], np.repeat(ids[0], 2), np.append(ids[0], 200), ids[0] - 1):
        found = _server_routing([[bad], [ids[1]], [ids[2]]], plan, receive, 7, True)
        assert found[0].shape == (0,) and found[1] is None


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_a_16_bit_wire_rounds_the_terms_and_sums_and_carries_two_bytes_a_value(tmp_path, wire):
    """--wire-dtype: the server receives 2-byte values, sums them in the run's dtype, and each
    owner gets its sums rounded once more: within two roundings of the exact sums (per term
    and per sum, relative to the terms' size), and in the run's dtype."""
    shard_dir = islands_shards(tmp_path)
    world = ThreadWorld(len(read_manifest(shard_dir).client_sizes()) + 1)
    results = run_exchange(shard_dir, "compact", 64.0, None, wire_dtype=wire, world=world)
    unit = torch.finfo(wire).eps
    rounded = []
    for (result, _, _, _, _), expected in zip(results[1:], expected_sums(results)):
        assert result.dtype == torch.float64
        scale = np.abs(expected).max(initial=1.0)
        assert np.max(np.abs(result.numpy() - expected), initial=0.0) <= 4 * unit * scale
        rounded.append(not np.array_equal(result.numpy(), expected))
    assert rounded == [True, True, False]  # client 2 receives nothing
    terms = [value for kind, _, value in world.server_received  # [rows, d]; the ids are 1-D
             if kind == "gatherv" and value.ndim == 2]
    assert terms and all(value.dtype.itemsize == 2 for value in terms)
    with pytest.raises(ValueError, match="--wire-dtype with --exchange 'reduce': expected "
                                         "--exchange one of compact"):
        build_exchange(ThreadWorld(1).run(lambda comm: comm)[0], "reduce", 1024, 5,
                       torch.float64, wire_dtype=wire)
