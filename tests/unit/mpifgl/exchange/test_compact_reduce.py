"""mpifgl.exchange.compact_reduce: every client learns the row in U (the union of all touched
rows) of each of its touched rows, in as many rounds of ids as the buffer cap needs."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.exchange import ONE_ROW_MB, expected_sums, islands_shards, run_exchange


@pytest.mark.parametrize("buffer_mb", [64.0, ONE_ROW_MB])
def test_each_touched_row_gets_its_row_in_the_union(tmp_path, buffer_mb):
    """One id per round at the smallest cap: the rounds of Scatterv add up to every row."""
    results = run_exchange(islands_shards(tmp_path), "compact-reduce", buffer_mb, None)
    plans = [plan for _, _, _, plan, _ in results[1:]]
    union = np.unique(np.concatenate([plan.touched for plan in plans]))
    for plan in plans:
        rows = plan.routing.send_sum_rows
        assert rows.shape == plan.touched.shape
        np.testing.assert_array_equal(union[rows], plan.touched)
    for (result, _, _, _, _), expected in zip(results[1:], expected_sums(results)):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-12)
