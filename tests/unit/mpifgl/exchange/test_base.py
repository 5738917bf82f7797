"""mpifgl.exchange.base: the cut of rows into chunks under the buffer cap."""
from __future__ import annotations

import numpy as np

from mpifgl.exchange.base import chunk_bounds


def test_chunk_bounds_respect_the_budget_and_give_big_rows_their_own_chunk():
    cost = np.asarray([2, 2, 2, 5, 1, 1, 1, 9, 1])
    bounds = chunk_bounds(cost, 4)
    assert bounds.tolist() == [0, 2, 3, 4, 7, 8, 9]
    sums = [cost[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
    assert all(s <= 4 or b - a == 1 for s, a, b in zip(sums, bounds[:-1], bounds[1:]))
    assert chunk_bounds(cost, 100).tolist() == [0, 9]
    assert chunk_bounds(np.zeros(0, np.int64), 4).tolist() == [0]
