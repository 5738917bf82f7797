"""``--secure``: the compact exchange with every term masked (docs/privacy.md). It wraps the
compact exchange's routing (the same ids, chunks and client-order sums) and replaces what travels:
fixed-point words in Z_2^k plus each sender's keystream for the owner (``SecureSession``),
summed in the ring at the server, unmasked and decoded by each owner.

Each use of a slot runs with the slot's lagged range (``mpifgl.fixed_point.LaggedRange``). Chunk
0 carries a head row each way: each sender's needed exponent up, the largest of them down; every
rank so learns the slot's next range and whether this attempt's range was exceeded, in which
case every rank runs the whole exchange again (the key streams reading on) before writing
anything.
"""
from __future__ import annotations

import numpy as np
import torch

from mpifgl import ring as ring_words
from mpifgl.exchange.base import Routing, Slot
from mpifgl.exchange.compact import CompactExchange, compact_routing, sum_matrices
from mpifgl.fixed_point import (EMPTY_EXPONENT, ceil_exponent, exponent_word, largest_exponent,
                                ring_of, scale_exponent, word_exponent)
from mpifgl.graph import CrossExchangePlan
from mpifgl.operators import numpy_dtype
from mpifgl.secure import ExchangeMasks, SecureSession

PATTERNS, MASKS = "sum_patterns", "masks"  # Routing.extra keys


class MaskedExchange:
    """``Exchange``'s interface (prepare, run) over a compact exchange's routing."""

    def __init__(self, compact: CompactExchange, session: SecureSession):
        self.compact = compact
        self.session = session
        self.comm = compact.comm
        self.dtype = compact.dtype
        self.float_type = np.dtype(numpy_dtype(compact.dtype))
        self.wire = ring_of(self.float_type)  # the ring words that travel and are added
        self.wire_torch = torch.from_numpy(np.zeros(0, self.wire)).dtype

    def prepare(self, plan: CrossExchangePlan) -> None:
        compact = self.compact
        with self.comm.counting_exchange():
            routing, _, _ = compact_routing(self.comm, plan, compact.id_budget,
                                            compact.row_budget, gathered=True)
            if routing.sender_rows is not None:
                routing.extra[PATTERNS] = sum_matrices(routing, heads=True)
                routing.sender_rows = None  # in the patterns now
        plan.routing = routing
        if not self.comm.is_server:
            own = plan.own_segment
            receive_chunks = [(routing.first_owned_row(c, own), int(routing.owned_rows(c)[own]))
                              for c in range(routing.num_chunks)]
            routing.extra[MASKS] = self.session.exchange_masks(plan, receive_chunks)

    def run(self, plan: CrossExchangePlan, y: torch.Tensor, slot: Slot,
            total: torch.Tensor | None = None) -> torch.Tensor:
        """As ``Exchange.run``. The masking runs on the host: a GPU's terms are copied there
        first and the decoded sums back."""
        routing = plan.routing
        assert routing is not None, "prepare(plan) must run before the plan's first exchange"
        values = y.detach().contiguous()
        on_host = y.device.type == "cpu"
        result = total if total is not None and on_host else \
            torch.zeros(tuple(y.shape), dtype=self.dtype)
        with self.comm.counting_exchange():
            self._exchange(plan, routing, values, result.numpy(), on_host and total is not None,
                           slot)
        if on_host:
            return result
        if total is None:
            return result.to(y.device)
        return total.add_(result.to(y.device))

    def _send_rows(self, plan, routing, c, values: torch.Tensor) -> np.ndarray:
        return self.compact.send_rows(plan, routing, c, values).cpu().numpy()

    def _exchange(self, plan: CrossExchangePlan, routing: Routing, values: torch.Tensor,
                  result: np.ndarray, add: bool, slot: Slot) -> None:
        if routing.num_chunks == 0:  # no cross-client row anywhere (every rank knows)
            return
        masks: ExchangeMasks | None = routing.extra.get(MASKS)
        first_rows = self._send_rows(plan, routing, 0, values)
        if routing.num_chunks == 1 or masks is None:
            needed = largest_exponent(first_rows)
        else:  # a bound rather than every chunk's terms computed twice
            bound = masks.term_bound * (float(torch.max(torch.abs(values)))
                                        if values.numel() else 0.0)
            needed = ceil_exponent(bound * (1 + 2.0 ** -10)) if bound else EMPTY_EXPONENT
        ranges = self.session.ranges
        used = int(ranges.begin(slot, np.asarray([needed]),
                                lambda v: self.comm.max_to_all(torch.from_numpy(v)).numpy())[0])
        width = values.shape[1]
        while True:
            exponent = scale_exponent(self.wire, self.session.num_clients, used)
            for c in range(routing.num_chunks):
                rows = first_rows if c == 0 else self._send_rows(plan, routing, c, values)
                summed, largest = self._sum_chunk(routing, c, rows, exponent, needed,
                                                  needed <= used)
                largest = self._scatter_chunk(routing, c, summed, largest, used, exponent, result,
                                              plan.receive_rows, plan.own_segment, width, add)
                if c == 0:
                    redo = ranges.settle(slot, np.asarray([largest]), np.asarray([used]))
                    if redo is not None:
                        used = int(redo[0])
                        break
            else:
                return

    def _sum_chunk(self, routing: Routing, c: int, rows: np.ndarray, exponent: int,
                   needed: int, in_range: bool) -> tuple[np.ndarray | None, int | None]:
        """Chunk c's masked ring sums at the server (None elsewhere; chunk 0 with an empty head
        row before each owner's rows) and, for chunk 0, the largest exponent the senders report
        (at the server) in the first word of their head rows."""
        comm, width = self.comm, rows.shape[1]
        head = 1 if c == 0 else 0
        counts = None
        if comm.is_server:
            send = np.zeros(0, dtype=self.wire)
            counts = routing.gathered_rows(c) * width
            counts[1:] += head * width  # every client's head row
        else:
            send = np.empty((head + rows.shape[0]) * width, dtype=self.wire)
            if head:
                send[:width] = 0
                send[:1] = exponent_word(needed, self.wire)
            # one chunk: ``needed`` is these very terms' exponent, so it proves their range
            self.session.mask_rows(routing.extra[MASKS], int(routing.send_bounds[c]), rows,
                                   exponent, self.wire, in_range, out=send[head * width:],
                                   largest=needed if routing.num_chunks == 1 else None)
        flat = comm.gatherv(torch.from_numpy(send), counts)
        if flat is None:
            return None, None
        gathered = flat.numpy().reshape(-1, width)
        largest = None
        if head:
            head_rows = (np.cumsum(counts) - counts)[1:] // width  # each client's first row
            largest = int(np.max(word_exponent(gathered[head_rows, 0]), initial=EMPTY_EXPONENT))
        pattern = routing.extra[PATTERNS][c]
        return ring_words.sum_selected_rows(pattern.indptr, pattern.indices, gathered), largest

    def _scatter_chunk(self, routing: Routing, c: int, summed: np.ndarray | None,
                       largest: int | None, used: int, exponent: int, result: np.ndarray,
                       receive_rows: np.ndarray, own: int, width: int, add: bool) -> int | None:
        """Send each owner its masked sums of chunk c (chunk 0: after a head row whose first word
        is the largest exponent); this client unmasks and writes (or adds) them unless that
        exponent exceeds ``used``. Returns the largest exponent for chunk 0 on every rank."""
        head = 1 if c == 0 else 0
        per_owner = routing.owned_rows(c)
        counts = np.concatenate([[0], per_owner + head]) * width
        send = None
        if self.comm.is_server:
            send = summed.ravel()
            if head:
                head_rows = (np.cumsum(counts) - counts)[1:] // width
                summed[head_rows, 0] = exponent_word(largest, self.wire)[0]
        mine = int(per_owner[own]) if own >= 0 else 0
        received = self.comm.scatterv(None if send is None else torch.from_numpy(send),
                                      counts if self.comm.is_server else None,
                                      int(counts[self.comm.rank]), self.wire_torch).numpy()
        if head and not self.comm.is_server:
            largest, received = int(word_exponent(received[:1])[0]), received[width:]
        if mine:
            # the scattered words are this rank's own buffer: unmasked in place. A failed
            # attempt (chunk 0 beyond the range) reads its streams too, so that every sender's
            # key stream and this owner's copy stay at the same byte, but stores nothing.
            first = routing.first_owned_row(c, own)
            targets = receive_rows[first:first + mine] if c > 0 or largest <= used else None
            self.session.unmask_rows(routing.extra[MASKS], c, received.reshape(mine, width),
                                     exponent, result, targets, add)
        return largest
