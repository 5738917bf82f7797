"""mpifgl.exchange.compact: the server's routing and the counting sort of its sum matrices
against what a sort would give."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.arrays import offsets
from fgl_common.shard_format import read_manifest
from mpifgl.exchange import build_exchange
from mpifgl.exchange.base import chunk_bounds
from mpifgl.exchange.compact import _server_routing, _stable_order
from mpifgl.graph import CrossExchangePlan
from tests.helpers.exchange import expected_sums, islands_shards, run_exchange
from tests.helpers.thread_comm import ThreadWorld


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
