"""mpifgl.methods.bns: the boundary-node sampler keeps inner nodes and scales the boundary."""
from __future__ import annotations

import numpy as np
import pytest

from mpifgl.methods.bns import BoundaryNodeSampler


def test_bns_sampler_keeps_inner_nodes_and_scales_boundary():
    boundary = np.array([False, True, True, False, True] * 200)
    sampler = BoundaryNodeSampler(boundary, 0.3, np.random.default_rng(0))
    kept = np.zeros(boundary.shape[0])
    for _ in range(200):
        sample = sampler.sample()
        assert np.all(np.diff(sample.index) > 0)
        assert set(np.flatnonzero(~boundary)) <= set(sample.index.tolist())
        assert np.array_equal(sample.probability, np.where(boundary[sample.index], 0.3, 1.0))
        kept[sample.index] += 1
    assert kept[boundary].mean() / 200 == pytest.approx(0.3, abs=0.01)
    everything = BoundaryNodeSampler(boundary, 1.0, np.random.default_rng(0)).sample()
    assert np.array_equal(everything.index, np.arange(boundary.shape[0]))
