"""``--secure``: the masked protocols. The server (and any rank that relays) handles only values
that look like uniform random bits; each owner recovers only its rows' sums, and the server only
the totals it needs. No mpi4py here: collectives go through the Communicator passed in.
docs/privacy.md is the one home of what each rank can learn in each mode.

One rank's ``SecureSession`` holds its run's keys (``mpifgl.keys``) and the lagged ranges of
every slot (``mpifgl.fixed_point.LaggedRange``), and offers:

* the compact exchange's masks (``exchange_masks``, ``mask_rows``, ``unmask_rows``; the exchange
  itself is ``mpifgl.exchange.masked``): sender i adds to the terms it sends for owner j the next
  words of the stream of k_{i->j}, row by row (rows in ascending S-position: the order of i's
  touched rows inside j's segment, which chunking only cuts, never reorders). The server adds
  masked terms in the ring; owner j knows from its own cross block which of its rows each sender
  touches, in the same order (A_ij = A_ji^T), reads the same words and subtracts them;
* sums over clients (``sum_to_all``, ``sum_to_server``: weight gradients, the loss, counts) with
  zero-sum pairwise masks (client i adds keystream(k_{ij}) for j > i and subtracts it for
  j < i), cancelling only in the total over all clients. ``MaskedSums`` offers them through the
  Communicator interface, so the training loop calls the same sums with or without --secure.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fgl_common.arrays import offsets
from mpifgl import ring as ring_words
from mpifgl.communicator import Communicator
from mpifgl.fixed_point import (EMPTY_EXPONENT, LaggedRange, decode, encode, ring_of,
                                scale_exponent, segment_exponents)
from mpifgl.keys import KeystreamUse, RunKeys

# the masked sum's exponent histogram: HISTOGRAM_WORDS buckets per segment, bucket
# HISTOGRAM_AT_RANGE holding the lagged range itself (lower exponents share bucket 0, those more
# than HISTOGRAM_WORDS - 1 - HISTOGRAM_AT_RANGE bits above it the top bucket)
HISTOGRAM_WORDS = 64
HISTOGRAM_AT_RANGE = 48


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
    """One rank's side of --secure for a run: its keys (the server holds none), the lagged
    ranges of every slot, and the masking of the exchange and of the sums."""

    def __init__(self, client_id: int, num_clients: int, keys: RunKeys):
        self.client_id = client_id
        self.num_clients = num_clients
        self.keys = keys
        self.ranges = LaggedRange()
        self.stream_log: list[KeystreamUse] | None = None  # tests switch it on
        self._scratch = np.empty(0, dtype=np.uint8)  # keystream bytes, reused across calls

    def __repr__(self) -> str:  # keys must never reach a log line (nor a pickle: RunKeys refuses)
        return f"SecureSession(client {self.client_id} of {self.num_clients})"

    @classmethod
    def agree(cls, comm: Communicator) -> "SecureSession":
        """Collective: this run's keys (``RunKeys.agree``)."""
        return cls(comm.rank - 1, comm.size - 1, RunKeys.agree(comm))

    @property
    def redos(self) -> int:
        return self.ranges.redos

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
        owner_first = np.searchsorted(plan.touched, plan.segment_start).astype(np.int64)
        rows_from = (plan.receive_senders if plan.receive_senders is not None
                     else self._rows_from(plan, owner_first))
        chunks = [self._unmask_chunk(rows_from, first, count) for first, count in receive_chunks]
        term_bound = 0.0
        send = plan.send_rows.arrays if plan.send_rows is not None else None
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
        m = self.num_clients
        if plan.send_rows is None:
            return [None] * m
        send = plan.send_rows.arrays
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
        return UnmaskChunk(senders, offsets(np.bincount(target, minlength=count)),
                           np.argsort(target, kind="stable"))

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
        for j, stream in self.keys.to.items():
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
            self.keys.from_[i].read_into(streams[at:at + high - low], "unmask", self.stream_log)
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
        for j, stream in self.keys.pair.items():
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
            return _sum_to_all(comm, masked).view(np.int64)
        ring, m = ring_of(values.dtype), self.num_clients
        bounds = offsets(segments or [values.shape[0]])
        count, size = bounds.shape[0] - 1, values.shape[0]
        # the server holds no key and no terms: it adds zeros, unencoded (it is on every
        # client's critical path)
        holds_terms = self.client_id >= 0
        needed = (segment_exponents(values, bounds) if holds_terms
                  else np.full(count, EMPTY_EXPONENT, dtype=np.int64))
        slot = ("sum", tuple(np.diff(bounds).tolist()))
        # the slot's first use agrees its range: once per run
        used = self.ranges.begin(slot, needed, lambda v: _max_to_all(comm, v))
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
            total = _sum_to_all(comm, message)
            histogram = total[size:].reshape(count, HISTOGRAM_WORDS) != 0
            if histogram[:, -1].any():  # an exponent beyond the window: ask for it exactly
                largest = _max_to_all(comm, needed)
            else:  # each segment's highest occupied bucket
                top = HISTOGRAM_WORDS - 1 - np.argmax(histogram[:, ::-1], axis=1)
                largest = np.where(histogram.any(axis=1), used + top - HISTOGRAM_AT_RANGE,
                                   EMPTY_EXPONENT)
            redo = self.ranges.settle(slot, largest, used)
            if redo is None:
                result = np.empty(size, dtype=values.dtype)
                for low, high, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(),
                                        exponents.tolist()):
                    decode(total[low:high], e, values.dtype, out=result[low:high])
                return result
            used = redo

    def sum_to_server(self, comm: Communicator, counts: np.ndarray) -> np.ndarray | None:
        """Collective: the sum of integer-valued float64 counts at the server (None
        elsewhere), masked like ``sum_to_all``."""
        encoded = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64).view(np.uint64)
        words = encoded + self._zero_sum_words(encoded.shape[0], np.uint64)
        total = comm.sum_to_server(torch.from_numpy(words))
        return None if total is None else total.numpy().view(np.int64).astype(np.float64)


def _sum_to_all(comm: Communicator, words: np.ndarray) -> np.ndarray:
    return comm.sum_to_all(torch.from_numpy(words)).numpy()


def _max_to_all(comm: Communicator, values: np.ndarray) -> np.ndarray:
    return comm.max_to_all(torch.from_numpy(np.asarray(values, dtype=np.int64))).numpy()


class MaskedSums:
    """A Communicator whose sums over ranks are masked (``SecureSession.sum_to_all`` and
    ``sum_to_server``); every other call goes to the wrapped communicator unchanged. What a run
    with --secure hands its trainer and method, so they call one ``sum_to_all``."""

    def __init__(self, comm: Communicator, session: SecureSession):
        self.inner = comm
        self.session = session
        self._redos_at_reset = session.redos

    def __getattr__(self, name: str) -> Any:  # the rest of the Communicator interface
        return getattr(self.inner, name)

    def reset_counters(self) -> None:
        self.inner.reset_counters()
        self._redos_at_reset = self.session.redos

    def extra_counters(self) -> dict[str, int]:
        """Masked operations redone since reset_counters (a term outgrew its lagged range):
        every rank runs the same redos, so any rank's count is the run's; and the inner
        communicator's own counts."""
        return {**self.inner.extra_counters(),
                "secure_redos": self.session.redos - self._redos_at_reset}

    def counting_exchange(self) -> AbstractContextManager[None]:
        return self.inner.counting_exchange()

    def sum_to_all(self, values: torch.Tensor, segments: list[int] | None = None) -> torch.Tensor:
        return torch.from_numpy(self.session.sum_to_all(self.inner, values.numpy(), segments))

    def sum_to_server(self, values: torch.Tensor) -> torch.Tensor | None:
        total = self.session.sum_to_server(self.inner, values.numpy())
        return None if total is None else torch.from_numpy(total)
