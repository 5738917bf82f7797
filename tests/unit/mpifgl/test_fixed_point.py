"""mpifgl.fixed_point: exponents, encode/decode round trips and overflow, and LaggedRange's
decisions by hand (the masked operations that use it run in test_secure.py)."""
from __future__ import annotations

import numpy as np
import pytest

from mpifgl import fixed_point
from mpifgl.fixed_point import LaggedRange


def test_segment_exponents_equal_each_segments_largest_exponent():
    """One pass for all segments: each segment's largest_exponent, EMPTY_EXPONENT for an empty
    or all-zero one (also after empty ones), and a NaN or infinity refused with its value."""
    rng = np.random.default_rng(5)
    bounds = np.asarray([0, 0, 30, 34, 34, 50, 51])
    values = rng.normal(scale=4.0, size=51)
    values[30:34] = 0.0
    values[34:50] *= 1e-9
    values[50] = -2.0 ** 40  # a power of two: frexp's exponent, 2^40 = 0.5 * 2^41
    exponents = fixed_point.segment_exponents(values, bounds)
    expected = [fixed_point.largest_exponent(values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert exponents.tolist() == expected
    assert exponents[0] == exponents[2] == exponents[3] == fixed_point.EMPTY_EXPONENT
    assert exponents[5] == 41
    for bad in (np.nan, -np.inf):
        values[40] = bad
        with pytest.raises(fixed_point.FixedPointOverflow, match=f"is {abs(bad)}, expected a finite"):
            fixed_point.segment_exponents(values, bounds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_decode_round_trip_and_overflow(dtype):
    ring = fixed_point.ring_of(np.dtype(dtype))
    values = np.asarray([-3.5, 0.0, 1e-3, 29.9], dtype=dtype)
    e = fixed_point.scale_exponent(ring, 8, fixed_point.ceil_exponent(29.9))
    decoded = fixed_point.decode(fixed_point.encode(values, e, ring, 8), e, np.dtype(dtype))
    assert np.max(np.abs(decoded - values)) <= 2.0 ** (-e - 1) + np.finfo(dtype).eps * 30
    # eight terms at the limit still sum without wrapping
    terms = [fixed_point.encode(np.asarray([-29.9], dtype), e, ring, 8) for _ in range(8)]
    total = np.sum(terms, axis=0, dtype=ring)
    assert abs(fixed_point.decode(total, e, np.dtype(np.float64))[0] + 8 * 29.9) < 1e-5
    with pytest.raises(fixed_point.FixedPointOverflow, match="exceeds the fixed-point range"):
        fixed_point.encode(np.asarray([64.0], dtype), e, ring, 8)
    with pytest.raises(fixed_point.FixedPointOverflow, match="finite"):
        fixed_point.ceil_exponent(float("nan"))


def test_lagged_range_records_uses_and_asks_for_a_redo_beyond_its_range():
    """The first use agrees (the callback), the next runs with last + headroom; a use beyond
    its range is not recorded and gets max(used, largest) to run again."""
    ranges, agreed = LaggedRange(), []
    slot = ("sum", (3, 2))
    first = ranges.begin(slot, np.asarray([4, fixed_point.EMPTY_EXPONENT]),
                         lambda needed: agreed.append(needed) or needed + 1)
    assert first.tolist() == [5, fixed_point.EMPTY_EXPONENT + 1] and len(agreed) == 1
    assert ranges.settle(slot, np.asarray([4, fixed_point.EMPTY_EXPONENT]), first) is None
    lagged = ranges.begin(slot, np.asarray([0, 0]), lambda needed: pytest.fail("agreed twice"))
    assert lagged.tolist() == [4 + fixed_point.HEADROOM_BITS, fixed_point.EMPTY_EXPONENT]
    redo = ranges.settle(slot, np.asarray([9, -3]), lagged)
    assert redo.tolist() == [9, -3] and ranges.redos == 1
    assert ranges.agreed[slot] == (4, fixed_point.EMPTY_EXPONENT)  # the failed use: unrecorded
    assert ranges.settle(slot, np.asarray([9, -3]), redo) is None
    # the growth 4 -> 9 widens the headroom of the next uses (within the clamp)
    assert ranges.lagged(slot).tolist() == [9 + 5, -3 + fixed_point.HEADROOM_BITS]
    # a checkpoint's copy takes every later use as the original does (a resumed --secure run)
    copy = LaggedRange()
    copy.restore(ranges.state())
    for largest in ([12, -3], [2, 0], [30, 1]):
        used = ranges.begin(slot, np.asarray([0, 0]), lambda needed: pytest.fail("agreed"))
        assert copy.begin(slot, np.asarray([0, 0]), lambda needed: pytest.fail("agreed")
                          ).tolist() == used.tolist()
        assert ((copy.settle(slot, np.asarray(largest), used) is None)
                == (ranges.settle(slot, np.asarray(largest), used) is None))
        assert copy.lagged(slot).tolist() == ranges.lagged(slot).tolist()
    assert copy.redos == ranges.redos
