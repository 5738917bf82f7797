"""``--secure``'s word arithmetic in Z_2^k, as compiled loops: each runs in one pass over the
words where numpy needs several (scale, round, convert, add a keystream) or a sparse product that
multiplies every word by 1 (scipy's integer kernel, slower than its float one).

The loops work on the signed view of the ring words (int32 for Z_2^32, int64 for Z_2^64): their
additions wrap, which is the ring's addition, and a rounded float converts to them exactly
while it lies within the range the caller checked. Scaling by 2^e is a multiply where 2^e is a
normal number of the float type (exact), else ldexp (the same correctly rounded result).
numba compiles a loop on its first call (cached beside this file), so runs without --secure
never import it.
"""
from __future__ import annotations

import functools
import math

import numpy as np

SIGNED = {np.dtype(np.uint32): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.int64)}
# per float type, the exponents e (exclusive bounds) for which 2^e is a normal number
_NORMAL_EXPONENTS = {np.dtype(t): (int(np.finfo(t).minexp), int(np.finfo(t).maxexp))
                     for t in (np.float32, np.float64)}


def _compiled(loop):
    """numba.njit(loop) on the first call: importing numba is slow, and only --secure runs need
    it."""
    compiled = None

    @functools.wraps(loop)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            import numba
            compiled = numba.njit(cache=True, nogil=True)(loop)
        return compiled(*args)

    return call


@_compiled
def _encode_add(values, exponent, scale, stream, out):
    if scale != 0:
        for k in range(values.shape[0]):
            out[k] = np.rint(values[k] * scale)  # an exact integer within the checked range
            out[k] += stream[k]
    else:
        for k in range(values.shape[0]):
            out[k] = np.rint(math.ldexp(values[k], exponent))
            out[k] += stream[k]


@_compiled
def _sum_selected_rows(indptr, indices, rows, out):
    width = rows.shape[1]
    for r in range(indptr.shape[0] - 1):
        total = out[r]
        total[:] = 0
        for k in range(indptr[r], indptr[r + 1]):
            row = rows[indices[k]]
            for c in range(width):
                total[c] += row[c]


@_compiled
def _unmask_decode(indptr, indices, streams, received, exponent, unscale, targets, result, add):
    width = received.shape[1]
    decoded = np.empty(width, result.dtype)
    for r in range(indptr.shape[0] - 1):
        words = received[r]
        for k in range(indptr[r], indptr[r + 1]):
            stream = streams[indices[k]]
            for c in range(width):
                words[c] -= stream[c]
        for c in range(width):  # to the float type first (the one rounding), then exact
            decoded[c] = words[c]
        if unscale != 0:
            for c in range(width):
                decoded[c] *= unscale
        else:
            for c in range(width):
                decoded[c] = math.ldexp(decoded[c], -exponent)
        target = result[targets[r]]
        if add:
            for c in range(width):
                target[c] += decoded[c]
        else:
            target[:] = decoded


def signed(words: np.ndarray) -> np.ndarray:
    """The signed integer view of ring words (int32 of uint32, int64 of uint64)."""
    return words.view(SIGNED[words.dtype])


def normal_power_of_two(exponent: int, dtype: np.dtype) -> bool:
    """Whether 2^exponent is a normal number of the float type: multiplying by it is exact."""
    low, high = _NORMAL_EXPONENTS[np.dtype(dtype)]
    return low < exponent < high


def _scale(exponent: int, dtype: np.dtype):
    """2^exponent in the float type where it is a normal number; 0 (the loops then use ldexp)."""
    return np.dtype(dtype).type(2.0 ** exponent if normal_power_of_two(exponent, dtype) else 0)


def encode_add(values: np.ndarray, exponent: int, stream: np.ndarray, out: np.ndarray) -> None:
    """out = round(values * 2^exponent) + stream in the ring, element by element (flat views of
    equal size); every |values * 2^exponent| lies within the ring's signed range (the caller
    checked)."""
    _encode_add(values.reshape(-1), exponent, _scale(exponent, values.dtype),
                signed(stream).reshape(-1), signed(out).reshape(-1))


def encode_add_segments(values: np.ndarray, bounds: np.ndarray, exponents: np.ndarray,
                        in_range: np.ndarray, stream: np.ndarray, out: np.ndarray) -> None:
    """``encode_add`` per segment [bounds[s], bounds[s+1]) of flat vectors with its exponent; a
    segment not ``in_range`` gets the stream alone (masked zeros)."""
    for low, high, exponent, fits in zip(bounds[:-1].tolist(), bounds[1:].tolist(),
                                         exponents.tolist(), in_range.tolist()):
        if not fits:
            out[low:high] = stream[low:high]
        elif high > low:
            encode_add(values[low:high], exponent, stream[low:high], out[low:high])


def sum_selected_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Row r of the result = the ring sum of rows[indices[k]] for k in indptr[r]..indptr[r+1]-1,
    added in that order (a 0/1 matrix's product without its multiplies)."""
    out = np.empty((indptr.shape[0] - 1, rows.shape[1]), dtype=rows.dtype)
    _sum_selected_rows(indptr, indices, signed(rows), signed(out))
    return out


def unmask_decode(indptr: np.ndarray, indices: np.ndarray, streams: np.ndarray,
                  received: np.ndarray, exponent: int, targets: np.ndarray, result: np.ndarray,
                  add: bool) -> None:
    """Per received row r: subtract from it (in place) the stream rows streams[indices[k]], k in
    indptr[r]..indptr[r+1]-1, then write its signed value times 2^-exponent (in result's float
    type, one rounding) into result[targets[r]], or add it there when ``add``."""
    _unmask_decode(indptr, indices, signed(streams), signed(received), exponent,
                   _scale(-exponent, result.dtype), targets, result, add)
