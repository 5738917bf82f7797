"""The compiled ring loops against numpy's arithmetic, word for word: rounding, wrap-around,
row order, and the decoded floats' one rounding."""
import numpy as np
import pytest
import scipy.sparse as sp

from mpifgl import ring
from tests.helpers.ring_reference import reference_decode, reference_encode

RUNS = [(np.float32, np.uint32), (np.float64, np.uint64)]


def random_words(rng, shape, ring_dtype):
    return rng.integers(0, np.iinfo(ring_dtype).max, size=shape, dtype=ring_dtype,
                        endpoint=True)


@pytest.mark.parametrize("float_type,ring_dtype", RUNS)
def test_encode_add_rounds_half_to_even_and_wraps(float_type, ring_dtype):
    rng = np.random.default_rng(0)
    ties = np.asarray([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0], dtype=float_type)
    bits = 8 * np.dtype(ring_dtype).itemsize
    # terms up to 2^(k-2) after scaling, the largest the fixed point allows with one client
    values = np.concatenate([ties, rng.uniform(-1, 1, 997).astype(float_type)]).reshape(-1, 5)
    stream = random_words(rng, values.shape, ring_dtype)
    out = np.empty(values.shape, ring_dtype)
    ring.encode_add(values, bits - 3, stream, out)
    assert np.array_equal(out, reference_encode(values, bits - 3, ring_dtype) + stream)  # wraps
    plain = np.empty(8, ring_dtype)
    ring.encode_add(ties, 0, np.zeros(8, ring_dtype), plain)
    assert ring.signed(plain).tolist() == [0, 2, 2, 0, -2, -2, 0, 0]


@pytest.mark.parametrize("float_type,ring_dtype", RUNS)
def test_sum_selected_rows_is_the_pattern_product_in_the_ring(float_type, ring_dtype):
    rng = np.random.default_rng(1)
    rows, gathered, width = 40, 150, 7
    target = rng.integers(0, rows - 5, gathered)  # the last rows select nothing
    order = np.argsort(target, kind="stable").astype(np.int32)
    indptr = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(target, minlength=rows), out=indptr[1:])
    words = random_words(rng, (gathered, width), ring_dtype)
    out = ring.sum_selected_rows(indptr, order, words)
    pattern = sp.csr_matrix((np.ones(gathered, ring_dtype), order, indptr), shape=(rows, gathered))
    assert np.array_equal(out, pattern @ words)
    assert not out[-5:].any()


@pytest.mark.parametrize("float_type,ring_dtype", RUNS)
@pytest.mark.parametrize("add", [False, True])
def test_unmask_decode_removes_the_streams_and_rounds_once(float_type, ring_dtype, add):
    rng = np.random.default_rng(2)
    rows, streams_count, width, exponent = 30, 80, 6, 20
    target = rng.integers(0, rows, streams_count)
    order = np.argsort(target, kind="stable")
    starts = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(target, minlength=rows), out=starts[1:])
    streams = random_words(rng, (streams_count, width), ring_dtype)
    sums = ring.signed(random_words(rng, (rows, width), ring_dtype)) >> 3  # within the range
    received = sums.view(ring_dtype).copy()
    np.add.at(received, target, streams)  # what the server hands the owner
    destinations = rng.permutation(rows + 10)[:rows]
    result = rng.standard_normal((rows + 10, width)).astype(float_type)
    expected = result.copy()
    decoded = reference_decode(sums.view(ring_dtype), exponent, float_type)
    if add:
        expected[destinations] += decoded
    else:
        expected[destinations] = decoded
    ring.unmask_decode(starts, order, streams, received, exponent, destinations, result, add)
    assert np.array_equal(received, sums.view(ring_dtype))  # unmasked in place
    assert np.array_equal(result, expected)


@pytest.mark.parametrize("float_type,ring_dtype", RUNS)
def test_encode_add_segments_encodes_each_segment_at_its_own_scale(float_type, ring_dtype):
    """Per segment: encode_add with that segment's exponent (normal and non-normal 2^e), the
    stream alone where a segment is not in range, nothing for an empty segment."""
    rng = np.random.default_rng(4)
    bounds = np.asarray([0, 40, 40, 47, 60, 61])
    beyond = np.finfo(float_type).maxexp + 3  # 2^e not a normal number: the ldexp path
    exponents = np.asarray([20, 5, beyond, 11, 0])
    in_range = np.asarray([True, True, True, False, True])
    values = rng.uniform(-1, 1, bounds[-1]).astype(float_type)
    values[40:47] *= 2.0 ** (20 - beyond)
    stream = random_words(rng, bounds[-1], ring_dtype)
    out = np.zeros(bounds[-1], ring_dtype)
    ring.encode_add_segments(values, bounds, exponents, in_range, stream, out)
    for s in range(5):
        piece = slice(bounds[s], bounds[s + 1])
        expected = (reference_encode(values[piece], exponents[s], ring_dtype) + stream[piece]
                    if in_range[s] else stream[piece])
        assert np.array_equal(out[piece], expected), s
