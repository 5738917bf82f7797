"""mpifgl.exchange.dense (reduce, star): the chunks follow from the sample's size alone, the same
on every rank, sized by the buffers the busiest rank holds; star sums in client order."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifgl.exchange.dense import ReduceExchange, StarExchange
from tests.helpers.exchange import expected_sums, islands_shards, run_exchange

ROW_BYTES = 5 * 8  # one float64 row of the width run_exchange uses


@pytest.mark.parametrize("mode,exchange", [("reduce", ReduceExchange), ("star", StarExchange)])
def test_the_chunks_follow_from_the_sample_size_on_every_rank(tmp_path, mode, exchange):
    """A cap of 10 rows: reduce holds 2 buffers per row (chunks of 5), star with 4 ranks
    holds 5 (chunks of 2); every rank, the server included, cuts the same chunks."""
    results = run_exchange(islands_shards(tmp_path), mode, 10 * ROW_BYTES / 2 ** 20, None)
    rows_per_chunk = 10 // exchange.buffers_per_row(4)
    total = int(results[1][3].segment_rows.sum())
    bounds = np.append(np.arange(0, total, rows_per_chunk), total)
    for _, _, _, plan, chunks in results:
        np.testing.assert_array_equal(plan.routing.position_bounds, bounds)
        assert chunks == bounds.shape[0] - 1
    for _, _, _, plan, _ in results[1:]:
        np.testing.assert_array_equal(plan.routing.send_bounds,
                                      np.searchsorted(plan.touched, bounds))
    for (result, _, _, _, _), expected in zip(results[1:], expected_sums(results)):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_the_servers_sums_add_in_client_order_in_every_gathering_mode(tmp_path):
    """compact and star sum at the server in client order from zero: bit for bit the same."""
    shard_dir = islands_shards(tmp_path)
    compact, star = (run_exchange(shard_dir, mode, 64.0, None) for mode in ("compact", "star"))
    for a, b in zip(compact[1:], star[1:]):
        assert torch.equal(a[0], b[0])
