"""``--secure``: the server (and any rank that relays) handles only values that look like uniform
random bits; each owner recovers only its rows' sums, and the server only the totals it needs.
No mpi4py here: collectives go through the Communicator passed in. docs/privacy.md is the one
home of what each rank can learn in each mode.

Key set-up, once per run (``SecureSession.agree``, collective): every client draws an X25519 key
pair in memory; the server relays the public keys and a fresh random salt; each pair of clients
derives, with HKDF-SHA256 of their shared secret, one key per direction for the exchange (i -> j
and j -> i differ: the X25519 secret is symmetric) and one pair key for the zero-sum masks. Keys
live only in this object: never pickled, logged or written (tests check the run's files).

Keystreams: AES-128-CTR, one stream per key for the whole run (``KeyStream``: a new nonce every
SEGMENT_BYTES, made by OpenSSL's AES-GCM code), read front to back: each masked operation (every
chunk of every exchange of training, evaluation and ``--save-logits``, every masked sum, every
redo) takes the stream's next bytes. Every rank runs the same operations in the same order, so a
stream's two holders (sender and owner, or a pair's two clients) read the same bytes for the
same words, and no byte masks twice; keys are fresh every run (a resume agrees new ones). One
cipher context per key and segment.

Fixed point: a float vector is encoded as round(v * 2^e) in the ring Z_2^k (k = 32 for float32
runs, k = 64 for float64, so the bytes on the wire do not change). With a range exponent b (terms
|v| <= 2^b) and c = ceil(log2 m), e = k - 2 - c - b keeps every term within 2^(k-2-c) and any sum
of m terms within 2^(k-1). Each sender checks its encoded terms against that limit before masking
(a wrapped sum cannot be detected afterwards). Rounding error per term <= 2^-(e+1), so a sum of m
terms is off by at most m * 2^-(e+1) (``sum_error_bound``).

Lagged exponents: b is not agreed per operation. Each slot (an exchange's pass and call, a masked
sum's segments) runs with the largest exponent of its last use plus a headroom (the largest
growth between its consecutive uses lately, HEADROOM_BITS to MAX_HEADROOM_BITS), learns this
use's largest from the operation's own messages (the exchange: a head row each way in chunk 0;
a sum: an unmasked exponent histogram tail), and runs again (the streams reading on) when a term
outgrew the range. Only a slot's first use agrees b with a max-allreduce. docs/privacy.md.

Compact exchange masks: sender i adds to the terms it sends for owner j the next words of the
stream of k_{i->j}, row by row (rows in ascending S-position: the order of i's touched rows
inside j's segment, which chunking only cuts, never reorders). The server adds masked terms in
the ring; owner j knows from its own cross block which of its rows each sender touches, in the
same order (A_ij = A_ji^T), reads the same words and subtracts them from those rows. Weight
gradients, the loss and the evaluation's counts: zero-sum pairwise masks (client i adds
keystream(k_{ij}) for j > i and subtracts it for j < i), cancelling only in the total over all
clients.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mpifgl import ring as ring_words
from mpifgl.ring import SIGNED, normal_power_of_two
from mpifgl.communicator import Communicator

log = logging.getLogger("mpifgl")

RING_DTYPES = {np.dtype(np.float32): np.dtype(np.uint32), np.dtype(np.float64): np.dtype(np.uint64)}
# AES-128: the 128-bit security level of the X25519 agreement the keys come from
KEY_BYTES = 16
SALT_BYTES = 32
# bytes of a key stream per nonce: below GCM's 2^32 counter blocks (and cryptography's byte cap
# for one GCM nonce), so no counter block repeats
SEGMENT_BYTES = 2 ** 35
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
# the masked sum's exponent histogram: HISTOGRAM_WORDS buckets per segment, bucket
# HISTOGRAM_AT_RANGE holding the lagged range itself (lower exponents share bucket 0, those more
# than HISTOGRAM_WORDS - 1 - HISTOGRAM_AT_RANGE bits above it the top bucket)
HISTOGRAM_WORDS = 64
HISTOGRAM_AT_RANGE = 48


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


def _per_segment(exponents: int | tuple[int, ...]) -> tuple[int, ...]:
    """A slot's exponents as a tuple: an exchange slot has one, a masked sum one per segment."""
    return exponents if isinstance(exponents, tuple) else (exponents,)


def headroom_bits(growths: np.ndarray) -> np.ndarray:
    """Per segment, the headroom of a slot's next use from the growths of its recent uses
    ([segments, uses]: bits between consecutive uses' largest exponents, NO_GROWTH where a
    use had none), clamped to [HEADROOM_BITS, MAX_HEADROOM_BITS]."""
    return np.clip(growths.max(axis=1, initial=NO_GROWTH), HEADROOM_BITS, MAX_HEADROOM_BITS)


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


# -- keys and keystreams ----------------------------------------------------------------------
_ZEROS = [memoryview(bytes(0))]


def _zeros(length: int) -> memoryview:
    """``length`` zero bytes, from one buffer kept across calls (the keystream's plaintext)."""
    if len(_ZEROS[0]) < length:
        _ZEROS[0] = memoryview(bytes(max(length, 2 * len(_ZEROS[0]))))
    return _ZEROS[0][:length]


def _derive(secret: bytes, salt: bytes, label: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt,
                info=label.encode()).derive(secret)


@dataclass
class KeystreamUse:
    """One read of a key's stream: which key (by its label, never the key), by which role, and
    the bytes [start, end) of the stream it took."""

    key_label: tuple
    role: str  # mask / unmask (exchange), add / subtract (zero-sum)
    start: int
    end: int


class KeyStream:
    """One key's AES-128-CTR keystream for the whole run, read front to back: every byte once.
    Its two holders (sender and owner, or a pair's adding and subtracting client) read it in the
    same order and amounts, because every rank runs the same masked operations in the same order
    on the same plans; so the same bytes mask and unmask, and no byte masks twice.

    Segment s of SEGMENT_BYTES is AES-CTR from counter block nonce(s) || 2 with a 32-bit block
    counter, nonce(s) = s in 12 big-endian bytes: exactly what AES-GCM encrypts a plaintext with,
    so OpenSSL's GCM code makes it (its wide-vector AES path is faster than its CTR path on
    current x86 CPUs; docs/privacy.md); the encryption of zeros is the keystream, and no tag is
    made."""

    def __init__(self, key: bytes, label: tuple):
        if len(key) != KEY_BYTES:
            raise ValueError(f"a {len(key)}-byte stream key, expected {KEY_BYTES} (AES-128)")
        self.key = key
        self.label = label
        self.position = 0  # bytes read so far
        self._segment = -1
        self._encryptor = None

    def __repr__(self) -> str:  # keys must never reach a log line
        return f"KeyStream({self.label}, at byte {self.position})"

    def read_into(self, out: np.ndarray, role: str, log: list[KeystreamUse] | None) -> None:
        """Fill the contiguous array ``out`` with the stream's next ``out.nbytes`` bytes."""
        count = out.nbytes
        if log is not None:
            log.append(KeystreamUse(self.label, role, self.position, self.position + count))
        buffer, done = out.reshape(-1).view(np.uint8), 0
        while done < count:
            segment, offset = divmod(self.position, SEGMENT_BYTES)
            if segment != self._segment:  # reads are sequential: the segment's first byte
                nonce = segment.to_bytes(12, "big")
                self._encryptor = Cipher(algorithms.AES(self.key), modes.GCM(nonce)).encryptor()
                self._segment = segment
            take = min(count - done, SEGMENT_BYTES - offset)
            # the encryption of zeros: the keystream itself
            self._encryptor.update_into(_zeros(take), buffer[done:done + take])
            done += take
            self.position += take


@dataclass
class UnmaskChunk:
    """What an owner needs to unmask one chunk of its receive rows."""

    # (sender, low, high): the sender's rows [low, high) of its send order for this owner (its
    # keystream rows) land in this chunk; their streams are read in this order, end to end
    senders: list[tuple[int, int, int]]
    # receive row r was masked by the keystream rows stream_rows[starts[r]:starts[r+1]] of
    # those streams end to end (each removed in one pass, no gather and scatter per sender)
    starts: np.ndarray
    stream_rows: np.ndarray


@dataclass
class ExchangeMasks:
    """Per plan, what a client needs to mask and unmask one compact exchange."""

    owner_first: np.ndarray  # int64 [m+1]: its touched rows of owner j are [f[j], f[j+1])
    # the largest row abs-sum of the send matrix: max|term| <= term_bound * max|y| (chunked
    # exchanges report this bound rather than compute every chunk's terms twice)
    term_bound: float = 0.0
    chunks: list[UnmaskChunk] = field(default_factory=list)  # per chunk of the exchange


class SecureSession:
    """One rank's key streams for a run (the server holds no key)."""

    def __init__(self, client_id: int, num_clients: int, exchange_to: dict[int, bytes],
                 exchange_from: dict[int, bytes], pair: dict[int, bytes]):
        self.client_id = client_id
        self.num_clients = num_clients
        # owner j -> stream of k_{me->j}; sender i -> stream of k_{i->me}; client j -> k_{me,j}
        self._to = {j: KeyStream(key, ("exchange", client_id, j))
                    for j, key in sorted(exchange_to.items())}
        self._from = {i: KeyStream(key, ("exchange", i, client_id))
                      for i, key in sorted(exchange_from.items())}
        self._pair = {j: KeyStream(key, ("zero-sum",) + tuple(sorted((client_id, j))))
                      for j, key in sorted(pair.items())}
        self.stream_log: list[KeystreamUse] | None = None  # tests switch it on
        # per slot (an exchange's layer and direction, a masked sum's segments): the largest
        # exponent of its last use and, per segment, the growths of its recent uses (the same
        # on every rank: every rank learns the largest exponents); the next use's lagged range
        self.agreed_exponents: dict[Hashable, int | tuple[int, ...]] = {}
        self._growths: dict[Hashable, np.ndarray] = {}  # [segments, HEADROOM_WINDOW], oldest first
        self.redos = 0  # masked operations run again because a term outgrew its lagged range
        self._scratch = np.empty(0, dtype=np.uint8)  # keystream bytes, reused across calls

    def __repr__(self) -> str:  # keys must never reach a log line
        return f"SecureSession(client {self.client_id} of {self.num_clients})"

    def __reduce__(self):
        raise TypeError("a SecureSession holds keys and is never pickled")

    @classmethod
    def agree(cls, comm: Communicator) -> "SecureSession":
        """Collective: fresh X25519 keys per client, public keys and a salt relayed by the
        server, HKDF-derived keys per direction and per pair."""
        num_clients = comm.size - 1
        client_id = comm.rank - 1
        private = None if comm.is_server else X25519PrivateKey.generate()
        public = None if private is None else private.public_key().public_bytes_raw()
        publics = comm.gather_objects(public)
        relayed = (publics[1:], os.urandom(SALT_BYTES)) if comm.is_server else None
        public_keys, salt = comm.broadcast_object(relayed)
        exchange_to, exchange_from, pair = {}, {}, {}
        if private is not None:
            if public_keys[client_id] != public:
                raise ValueError(f"--secure: the server relayed another public key for client "
                                 f"{client_id} than the one it sent")
            for j, other in enumerate(public_keys):
                if j == client_id:
                    continue
                secret = private.exchange(X25519PublicKey.from_public_bytes(other))
                exchange_to[j] = _derive(secret, salt, f"mpifgl exchange {client_id}->{j}")
                exchange_from[j] = _derive(secret, salt, f"mpifgl exchange {j}->{client_id}")
                low, high = sorted((client_id, j))
                pair[j] = _derive(secret, salt, f"mpifgl zero-sum {low}-{high}")
        return cls(client_id, num_clients, exchange_to, exchange_from, pair)

    def key_material(self) -> list[bytes]:
        """Every key this rank holds (for the tests that look for them in the run's files)."""
        return [s.key for streams in (self._to, self._from, self._pair)
                for s in streams.values()]

    def _words(self, count: int, ring: np.dtype) -> np.ndarray:
        """``count`` ring words of this session's scratch buffer (keystreams land there; valid
        until the next call: the masking loops add them at once, no fresh pages per stream)."""
        size = count * np.dtype(ring).itemsize
        if self._scratch.shape[0] < size:
            self._scratch = np.empty(max(size, 2 * self._scratch.shape[0]), dtype=np.uint8)
        return self._scratch[:size].view(ring)

    # -- the compact exchange -------------------------------------------------------------------
    def exchange_masks(self, plan, receive_chunks: list[tuple[int, int]]) -> ExchangeMasks:
        """Per plan (mpifgl.graph.CrossExchangePlan): where this client's send rows of each owner
        start, and per chunk of its receive rows ((first, count) each) which senders' keystream
        rows it removes where."""
        starts = np.concatenate([[0], np.cumsum(plan.segment_rows)]).astype(np.int64)
        owner_first = np.searchsorted(plan.touched, starts).astype(np.int64)
        rows_from = self._rows_from(plan, owner_first)
        chunks = [self._unmask_chunk(rows_from, first, count) for first, count in receive_chunks]
        term_bound = 0.0
        send = plan.send_rows
        if len(receive_chunks) > 1 and send is not None and send.data.size:
            row_sums = np.add.reduceat(np.abs(send.data.astype(np.float64)),
                                       send.indptr[:-1].clip(max=send.data.size - 1))
            row_sums[np.diff(send.indptr) == 0] = 0.0  # reduceat's empty rows
            term_bound = float(row_sums.max())
        return ExchangeMasks(owner_first, term_bound, chunks)

    def _rows_from(self, plan, owner_first: np.ndarray) -> list[np.ndarray | None]:
        """Per sender i (None for itself): positions, among this owner's receive rows, of the
        rows i touches, ascending (= i's send order for this owner). My touched rows in i's
        segment are the S-positions of i's nodes adjacent to my sampled nodes; those nodes (the
        send matrix's columns) are the rows i touches here (A_ij = A_ji^T)."""
        send, m = plan.send_rows, self.num_clients
        if send is None:
            return [None] * m
        entries = send.indptr[owner_first].astype(np.int64)  # each owner's first entry
        per_owner = np.diff(entries)
        adjacent = np.zeros((m, send.shape[1]), dtype=bool)
        adjacent[np.repeat(np.arange(m), per_owner),
                 send.indices[entries[0]:entries[-1]]] = True
        position = np.full(send.shape[1], -1, dtype=np.int64)
        position[plan.receive_rows] = np.arange(plan.receive_rows.shape[0])
        return [None if i == self.client_id else position[np.flatnonzero(adjacent[i])]
                for i in range(m)]

    @staticmethod
    def _unmask_chunk(rows_from: list[np.ndarray | None], first: int, count: int) -> UnmaskChunk:
        senders, targets = [], []
        for i, rows in enumerate(rows_from):
            if rows is None:
                continue
            low, high = (int(k) for k in np.searchsorted(rows, [first, first + count]))
            if high > low:
                senders.append((i, low, high))
                targets.append(rows[low:high] - first)
        target = np.concatenate(targets) if targets else np.zeros(0, np.int64)
        starts = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(np.bincount(target, minlength=count), out=starts[1:])
        return UnmaskChunk(senders, starts, np.argsort(target, kind="stable"))

    def lagged_ranges(self, slot: Hashable) -> list[int] | None:
        """Per segment, the range exponent the slot's next use runs with (None before its first
        use): the last use's largest plus the slot's headroom (``headroom_bits``)."""
        if slot not in self.agreed_exponents:
            return None
        return [a if a == EMPTY_EXPONENT else a + int(h)
                for a, h in zip(_per_segment(self.agreed_exponents[slot]),
                                headroom_bits(self._growths[slot]))]

    def _record(self, slot: Hashable, largest: int | tuple[int, ...]) -> None:
        """A use of ``slot`` succeeded with these largest exponents: they and their growth
        over the last use decide the next use's range."""
        now = np.asarray(_per_segment(largest), dtype=np.int64)
        if slot not in self.agreed_exponents:
            self._growths[slot] = np.full((now.shape[0], HEADROOM_WINDOW), NO_GROWTH, np.int64)
        else:
            last = np.asarray(_per_segment(self.agreed_exponents[slot]), dtype=np.int64)
            window = self._growths[slot]
            window[:, :-1] = window[:, 1:]  # the oldest use leaves the window
            window[:, -1] = np.where((last != EMPTY_EXPONENT) & (now != EMPTY_EXPONENT),
                                     now - last, NO_GROWTH)
        self.agreed_exponents[slot] = largest

    def _count_redo(self, slot: Hashable, largest, used) -> None:
        self.redos += 1
        log.debug("--secure: %s needed 2^%s beyond its lagged range 2^%s: redone (redo %d)",
                  slot, largest, used, self.redos)

    def exchange_range(self, comm: Communicator, slot: Hashable, needed: int) -> int:
        """The range exponent of this use of an exchange slot: the lagged one, or on the slot's
        first use the largest ``needed`` of any rank (collective, once per slot and run)."""
        ranges = self.lagged_ranges(slot)
        if ranges is not None:
            return ranges[0]
        return int(comm.max_to_all(np.asarray([needed], dtype=np.int64))[0])

    def settle(self, slot: Hashable, largest: int, used: int) -> bool:
        """The largest exponent any sender needed in this use of ``slot`` (every rank learns it
        from the server's head row): True if it exceeded the range ``used``, so the operation
        must run again with that exponent; else it is recorded for the next use."""
        if largest > used:
            self._count_redo(slot, largest, used)
            return True
        self._record(slot, largest)
        return False

    def mask_rows(self, masks: ExchangeMasks, send_low: int, rows: np.ndarray, exponent: int,
                  ring: np.dtype, in_range: bool = True, out: np.ndarray | None = None,
                  largest: int | None = None) -> np.ndarray:
        """This sender's terms [r, d] for its touched rows [send_low, send_low + r), encoded and
        masked per owner -> ring [r, d] (written into ``out``, r * d words, when given).
        ``in_range`` False: the terms exceed this attempt's range (it will be redone), so masked
        zeros stand in for them. ``largest``: the terms' largest_exponent, if known (encode)."""
        if out is None:
            out = np.empty(rows.size, dtype=ring)
        masked = out.reshape(rows.shape)
        if not rows.size:
            return masked
        send_high = send_low + rows.shape[0]
        # the rows are owner by owner: each owner's next keystream rows, end to end, then the
        # encoding adds them in its one pass
        streams = self._words(rows.size, ring).reshape(rows.shape)
        covered = 0
        for j, stream in self._to.items():
            low = max(send_low, int(masks.owner_first[j]))
            high = min(send_high, int(masks.owner_first[j + 1]))
            if high > low:
                stream.read_into(streams[low - send_low:high - send_low], "mask",
                                 self.stream_log)
                covered += high - low
        assert covered == rows.shape[0], "a client's touched rows lie in other clients' segments"
        if in_range:
            encode(rows, exponent, ring, self.num_clients, out=masked, largest=largest,
                   stream=streams)
        else:
            masked[...] = streams
        return masked

    def unmask_rows(self, masks: ExchangeMasks, chunk: int, received: np.ndarray,
                    exponent: int, result: np.ndarray, targets: np.ndarray | None,
                    add: bool = False) -> None:
        """This owner's receive rows of ``chunk``: from each (its buffer ``received`` [r, d], in
        place) subtract the next keystream rows of the senders that masked it, decode the ring
        sum and write it into result[targets[k]] (add it there when ``add``). ``targets`` None
        (a failed attempt): only read the streams, so that this owner stays level with its
        senders' copies of them."""
        part = masks.chunks[chunk]
        width = received.shape[1]
        streams = self._words(part.stream_rows.shape[0] * width,
                              received.dtype).reshape(-1, width)
        at = 0
        for i, low, high in part.senders:
            self._from[i].read_into(streams[at:at + high - low], "unmask", self.stream_log)
            at += high - low
        if targets is not None:
            ring_words.unmask_decode(part.starts, part.stream_rows, streams, received, exponent,
                                     targets, result, add)

    # -- sums over clients (weight gradients and loss, counts) ----------------------------------
    def _zero_sum_words(self, count: int, ring: np.dtype) -> np.ndarray:
        """This client's share of the pairwise masks that cancel in the total over all clients:
        keystream(k_ij) added for each j > i, subtracted for each j < i -> ``count`` ring words
        (this session's scratch, valid until its next use)."""
        words = self._words(2 * count, ring)
        total, stream_words = words[:count], words[count:]
        total.fill(0)
        for j, stream in self._pair.items():
            adding = self.client_id < j
            stream.read_into(stream_words, "add" if adding else "subtract", self.stream_log)
            (np.add if adding else np.subtract)(total, stream_words, out=total)
        return total

    def sum_to_all(self, comm: Communicator, values: np.ndarray,
                   segments: list[int] | None = None) -> np.ndarray:
        """Collective: the sum over ranks of a 1-D float vector (one scale per segment of
        ``segments`` lengths, default one; the server's values are not read) or int64 vector
        (exact, in Z_2^64), identical on every rank; the server and relaying ranks see only
        masked ring words.

        Floats: one collective in the common case. Each segment's scale comes from its last
        use (lagged range), and an unmasked tail of HISTOGRAM_WORDS words per segment counts
        the clients per needed exponent, so the sum itself tells every rank the range of the
        next use and whether a term outgrew this one (then the sum runs again)."""
        values = np.ascontiguousarray(values)
        if values.dtype == np.int64:
            masked = values.view(np.uint64) + self._zero_sum_words(values.shape[0], np.uint64)
            return comm.sum_to_all(masked).view(np.int64)
        ring, m = ring_of(values.dtype), self.num_clients
        bounds = np.cumsum([0] + list(segments or [values.shape[0]])).astype(np.int64)
        count, size = bounds.shape[0] - 1, values.shape[0]
        # the server holds no key and no terms: it adds zeros, unencoded (it is on every
        # client's critical path)
        holds_terms = self.client_id >= 0
        needed = (segment_exponents(values, bounds) if holds_terms
                  else np.full(count, EMPTY_EXPONENT, dtype=np.int64))
        slot = ("sum", tuple(np.diff(bounds).tolist()))
        ranges = self.lagged_ranges(slot)
        # the slot's first use agrees its range: once per run
        used = np.asarray(ranges, dtype=np.int64) if ranges is not None else comm.max_to_all(needed)
        # one buffer: the masked words, then the histogram tail (what travels, in one piece)
        message = np.empty(size + count * HISTOGRAM_WORDS, dtype=ring)
        tail = message[size:].reshape(count, HISTOGRAM_WORDS)
        reported = np.flatnonzero(needed != EMPTY_EXPONENT)
        while True:
            exponents = np.asarray([scale_exponent(ring, m, int(u)) for u in used], np.int64)
            if holds_terms:
                ring_words.encode_add_segments(values, bounds, exponents, needed <= used,
                                               self._zero_sum_words(size, ring),
                                               message[:size])
            else:
                message[:size] = 0
            tail.fill(0)
            tail[reported, np.clip(needed[reported] - used[reported] + HISTOGRAM_AT_RANGE, 0,
                                   HISTOGRAM_WORDS - 1)] = 1
            total = comm.sum_to_all(message)
            histogram = total[size:].reshape(count, HISTOGRAM_WORDS) != 0
            if histogram[:, -1].any():  # an exponent beyond the window: ask for it exactly
                largest = comm.max_to_all(needed)
            else:  # each segment's highest occupied bucket
                top = HISTOGRAM_WORDS - 1 - np.argmax(histogram[:, ::-1], axis=1)
                largest = np.where(histogram.any(axis=1), used + top - HISTOGRAM_AT_RANGE,
                                   EMPTY_EXPONENT)
            if np.all(largest <= used):
                self._record(slot, tuple(int(b) for b in largest))
                result = np.empty(size, dtype=values.dtype)
                for low, high, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(),
                                        exponents.tolist()):
                    decode(total[low:high], e, values.dtype, out=result[low:high])
                return result
            self._count_redo(slot, largest.tolist(), used.tolist())
            used = np.maximum(used, largest)

    def sum_to_server(self, comm: Communicator, counts: np.ndarray) -> np.ndarray | None:
        """Collective: the sum of integer-valued float64 counts at the server (None
        elsewhere), masked like ``sum_to_all``."""
        encoded = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64).view(np.uint64)
        total = comm.sum_to_server(encoded + self._zero_sum_words(encoded.shape[0], np.uint64))
        return None if total is None else total.view(np.int64).astype(np.float64)
