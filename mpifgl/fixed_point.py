"""``--secure``'s fixed point: float terms as integers in the ring Z_2^k, and the range each
masked operation (a "slot") runs with. Plain numpy; docs/privacy.md.

Fixed point: a float vector is encoded as round(v * 2^e) in the ring Z_2^k (k = 32 for float32
runs, k = 64 for float64, so the bytes on the wire do not change). With a range exponent b (terms
|v| <= 2^b) and c = ceil(log2 m), e = k - 2 - c - b keeps every term within 2^(k-2-c) and any sum
of m terms within 2^(k-1). Each sender checks its encoded terms against that limit before masking
(a wrapped sum cannot be detected afterwards). Rounding error per term <= 2^-(e+1), so a sum of m
terms is off by at most m * 2^-(e+1) (``sum_error_bound``).

Lagged ranges (``LaggedRange``): b is not agreed per operation. Each slot (an exchange's pass,
direction and layer; a masked sum's segments) runs with the largest exponent of its last use
plus a headroom (the largest growth between its consecutive uses lately, HEADROOM_BITS to
MAX_HEADROOM_BITS), learns this use's largest from the operation's own messages, and runs again
(the streams reading on) when a term outgrew the range. Only a slot's first use agrees b with a
max-allreduce.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable

import numpy as np

from mpifgl import ring as ring_words
from mpifgl.ring import SIGNED, normal_power_of_two

log = logging.getLogger("mpifgl")

RING_DTYPES = {np.dtype(np.float32): np.dtype(np.uint32), np.dtype(np.float64): np.dtype(np.uint64)}
# the exponent a rank reports when all its terms are zero (fits the int32 word that carries it)
EMPTY_EXPONENT = -(2 ** 30)
# bits of growth a lagged range absorbs (terms up to 2^h times the last use's largest): h is the
# largest growth between consecutive uses of the slot over its last HEADROOM_WINDOW uses, at least
# HEADROOM_BITS (a steady slot's precision) and at most MAX_HEADROOM_BITS (a rare larger jump is
# cheaper redone than paid for in every use's precision)
HEADROOM_BITS = 2
MAX_HEADROOM_BITS = 6
HEADROOM_WINDOW = 256
NO_GROWTH = -(2 ** 31)  # a use without a growth (the slot's first, or an all-zero segment)


class FixedPointOverflow(ValueError):
    """A value outside the agreed fixed-point range (or not finite): the sum would wrap."""


# -- fixed point ------------------------------------------------------------------------------
def ring_of(dtype: np.dtype) -> np.dtype:
    """The ring Z_2^k of a float dtype's runs: uint32 for float32, uint64 for float64."""
    return RING_DTYPES[np.dtype(dtype)]


def ceil_exponent(max_abs: float) -> int:
    """The smallest b with max_abs <= 2^b (EMPTY_EXPONENT for 0); refuses inf and NaN."""
    if not math.isfinite(max_abs):
        raise FixedPointOverflow(f"--secure: a value to be masked is {max_abs}, expected a finite "
                                 "number (the model diverged; lower --lr)")
    if max_abs == 0.0:
        return EMPTY_EXPONENT
    _, exponent = math.frexp(max_abs)  # max_abs = mantissa * 2^exponent, 0.5 <= mantissa < 1
    return exponent


def largest_exponent(values: np.ndarray) -> int:
    """ceil_exponent of the largest |value| (EMPTY_EXPONENT for none); refuses inf and NaN."""
    return int(segment_exponents(values.reshape(-1), np.asarray([0, values.size]))[0])


def segment_exponents(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``largest_exponent`` of each segment [bounds[s], bounds[s+1]) of a 1-D vector, for all
    segments in a few passes -> int64 [segments]; refuses inf and NaN."""
    exponents = np.full(bounds.shape[0] - 1, EMPTY_EXPONENT, dtype=np.int64)
    nonempty = np.flatnonzero(bounds[1:] > bounds[:-1])
    if not nonempty.size:
        return exponents
    # a nonempty segment's reduction runs on through the empty ones after it: they add nothing
    starts = bounds[:-1][nonempty]
    largest = np.maximum(np.maximum.reduceat(values, starts).astype(np.float64),
                         -np.minimum.reduceat(values, starts).astype(np.float64))
    finite = np.isfinite(largest)  # NaN propagates through the reductions
    if not finite.all():
        ceil_exponent(float(largest[~finite][0]))  # raises, naming the value
    exponents[nonempty] = np.where(largest > 0, np.frexp(largest)[1], EMPTY_EXPONENT)
    return exponents


def exponent_word(exponent: int, ring: np.dtype) -> np.ndarray:
    """One exponent as one word of the ring (signed; travels unmasked)."""
    return np.asarray([exponent], dtype=SIGNED[np.dtype(ring)]).view(ring)


def word_exponent(words: np.ndarray) -> np.ndarray:
    """The exponents carried by ring words -> int64."""
    return np.asarray(words).view(SIGNED[np.asarray(words).dtype]).astype(np.int64)


def scale_exponent(ring: np.dtype, num_clients: int, max_exponent: int) -> int:
    """e such that any term |v| <= 2^max_exponent encodes within 2^(k-2-c), c = ceil(log2 m)."""
    if max_exponent == EMPTY_EXPONENT:
        return 0
    bits = 8 * np.dtype(ring).itemsize
    return bits - 2 - term_headroom(num_clients) - int(max_exponent)


def term_headroom(num_clients: int) -> int:
    return max(0, math.ceil(math.log2(max(1, num_clients))))


def term_limit(ring: np.dtype, num_clients: int) -> float:
    """Largest encoded |term| allowed: 2^(k-2-c)."""
    return float(2 ** (8 * np.dtype(ring).itemsize - 2 - term_headroom(num_clients)))


def sum_error_bound(ring: np.dtype, num_clients: int, max_abs: float) -> float:
    """Absolute error bound of a decoded sum of at most m terms, each |v| <= max_abs:
    m * 2^-(e+1) (round to nearest per term)."""
    e = scale_exponent(ring, num_clients, ceil_exponent(max_abs))
    return num_clients * 2.0 ** (-e - 1)


def encode(values: np.ndarray, exponent: int, ring: np.dtype, num_clients: int,
           out: np.ndarray | None = None, largest: int | None = None,
           stream: np.ndarray | None = None) -> np.ndarray:
    """round(values * 2^exponent) in Z_2^k, after checking every term against the range. The
    float type of the run is kept (k = its width): the scaled values fit it exactly.

    ``out``: ring words of ``values``' size to write into (returned). ``largest``: the values'
    ``largest_exponent`` when the caller already has it; if it proves the range, the check
    needs no pass over the values (a failing proof still runs the exact check). ``stream``:
    keystream words of that size to add (the masked encoding, in the same pass)."""
    values = np.ascontiguousarray(values)
    float_type = np.float32 if ring == np.uint32 else np.float64
    values = values.astype(float_type, copy=False)
    limit = term_limit(ring, num_clients)
    limit_bits = 8 * np.dtype(ring).itemsize - 2 - term_headroom(num_clients)
    proven = (largest is not None and
              (largest == EMPTY_EXPONENT or largest + exponent <= limit_bits))
    if values.size and not proven:
        largest_value = float(max(values.max(), -values.min()))
        # compared as largest_value <= limit * 2^-exponent: 2^exponent itself may overflow a
        # float where the values are tiny (and NaN fails the comparison)
        if not largest_value <= math.ldexp(limit, -exponent):
            raise FixedPointOverflow(
                f"--secure: a value of magnitude {largest_value:.6g} exceeds the "
                f"fixed-point range {math.ldexp(limit, -exponent):.6g} agreed for this sum "
                f"(ring Z_2^{8 * ring.itemsize}, scale 2^{exponent}); expected finite values "
                "within it (the model diverged, or a rank reported a wrong maximum)")
    if out is None:
        out = np.empty(values.shape, dtype=ring)
    if stream is not None:
        ring_words.encode_add(values, exponent, stream, out)
        return out
    # scaling by a power of two is exact (ldexp where it is not a normal number of the type);
    # round and convert in one pass: the rounded values are exact integers within the ring
    scaled = (np.multiply(values, values.dtype.type(2.0 ** exponent))
              if normal_power_of_two(exponent, values.dtype) else np.ldexp(values, exponent))
    np.rint(scaled, out=out.view(SIGNED[ring]).reshape(values.shape), casting="unsafe")
    return out


def decode(ring_values: np.ndarray, exponent: int, dtype: np.dtype,
           out: np.ndarray | None = None) -> np.ndarray:
    """Signed value of each ring element times 2^-exponent, in ``dtype`` (one rounding)."""
    signed = ring_values.view(SIGNED[ring_values.dtype])
    dtype = np.dtype(dtype)
    if normal_power_of_two(-exponent, dtype):
        # the loop converts each word to dtype (the one rounding), then the exact scaling
        return np.multiply(signed, dtype.type(2.0 ** -exponent), out=out, dtype=dtype)
    return np.ldexp(signed.astype(dtype), -exponent, out=out)



# -- lagged ranges ------------------------------------------------------------------------------
def headroom_bits(growths: np.ndarray) -> np.ndarray:
    """Per segment, the headroom of a slot's next use from the growths of its recent uses
    ([segments, uses]: bits between consecutive uses' largest exponents, NO_GROWTH where a
    use had none), clamped to [HEADROOM_BITS, MAX_HEADROOM_BITS]."""
    return np.clip(growths.max(axis=1, initial=NO_GROWTH), HEADROOM_BITS, MAX_HEADROOM_BITS)


class LaggedRange:
    """The range exponents of every slot of a run, one per segment of the slot (an exchange
    slot has one segment). The same on every rank: every rank learns every use's largest
    exponents from the operation's messages, so every rank takes the same decisions.

    One use of a slot: ``begin`` gives the range it runs with; after the attempt, ``settle``
    with the largest exponents the operation revealed either records the use (None) or gives
    the range of the attempt to run again."""

    def __init__(self) -> None:
        # per slot: the largest exponents of its last use, and per segment the growths of its
        # recent uses [segments, HEADROOM_WINDOW], oldest first
        self.agreed: dict[Hashable, tuple[int, ...]] = {}
        self._growths: dict[Hashable, np.ndarray] = {}
        self.redos = 0  # operations run again because a term outgrew its lagged range

    def state(self) -> dict:
        """What a checkpoint keeps, so that a resumed run uses the ranges, hence rounds, as the
        uninterrupted run would (the keys may change; the sums they mask do not). Plain lists
        of ints: a checkpoint loads with torch.load(weights_only=True)."""
        return {"agreed": dict(self.agreed),
                "growths": {slot: g.tolist() for slot, g in self._growths.items()},
                "redos": self.redos}

    def restore(self, state: dict) -> None:
        self.agreed = dict(state["agreed"])
        self._growths = {slot: np.array(g, dtype=np.int64) for slot, g in state["growths"].items()}
        self.redos = state["redos"]

    def lagged(self, slot: Hashable) -> np.ndarray | None:
        """Per segment, the range exponent the slot's next use runs with (None before its first
        use): the last use's largest plus the slot's headroom (``headroom_bits``)."""
        if slot not in self.agreed:
            return None
        return np.asarray([a if a == EMPTY_EXPONENT else a + int(h)
                           for a, h in zip(self.agreed[slot], headroom_bits(self._growths[slot]))],
                          dtype=np.int64)

    def begin(self, slot: Hashable, needed: np.ndarray,
              agree: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The range of this use: the lagged one, or on the slot's first use the largest
        ``needed`` of any rank (``agree``: a max over ranks, collective, once per slot)."""
        lagged = self.lagged(slot)
        return lagged if lagged is not None else np.asarray(agree(needed), dtype=np.int64)

    def settle(self, slot: Hashable, largest: np.ndarray, used: np.ndarray) -> np.ndarray | None:
        """After an attempt with range ``used`` whose terms needed ``largest``: None when every
        segment fit (the use is recorded), else the range to run the attempt again with."""
        largest = np.asarray(largest, dtype=np.int64)
        if np.all(largest <= used):
            self._record(slot, largest)
            return None
        self.redos += 1
        log.debug("--secure: %s needed 2^%s beyond its lagged range 2^%s: redone (redo %d)",
                  slot, largest.tolist(), np.asarray(used).tolist(), self.redos)
        return np.maximum(used, largest)

    def _record(self, slot: Hashable, largest: np.ndarray) -> None:
        """A use of ``slot`` succeeded with these largest exponents: they and their growth
        over the last use decide the next use's range."""
        if slot not in self.agreed:
            self._growths[slot] = np.full((largest.shape[0], HEADROOM_WINDOW), NO_GROWTH, np.int64)
        else:
            last = np.asarray(self.agreed[slot], dtype=np.int64)
            window = self._growths[slot]
            window[:, :-1] = window[:, 1:]  # the oldest use leaves the window
            window[:, -1] = np.where((last != EMPTY_EXPONENT) & (largest != EMPTY_EXPONENT),
                                     largest - last, NO_GROWTH)
        self.agreed[slot] = tuple(int(b) for b in largest)
