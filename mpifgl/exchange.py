"""The cross-client exchange: the sum over other clients of their terms A_ij y_j, forward and
backward, through the server. No mpi4py here: every message goes through a Communicator.

For one sample S (or the full graph), client i's terms for every client are the rows of
``send = A_i,cross[S_i, S]^T y_i`` [n_S, d], laid out by S-position (client-ordered sampled
rows, ``graph.sample_columns``). Only the rows some own node is adjacent to are non-zero:
``plan.touched`` (t_i rows). Owner j needs the sum of all clients' rows of its segment; the rows
of that sum that can be non-zero are its own sampled nodes with a cross edge into S,
``plan.receive_rows`` (u_j rows), which j knows from its own cross block (A_ji = A_ij^T).

Modes (``--exchange``):

* compact (default): per plan, each client sends the server its touched row ids (int32 while
  n_S < 2^31) once; per exchange, only the values of its touched rows (Gatherv). The server sums
  them per row in client order (deterministic) and sends each owner the values of its
  receive rows only (Scatterv; the owner knows which rows they are, no ids come back).
* compact-reduce: same ids; the server answers each client with the positions of its rows in the
  union U of all touched rows (U = the owners' receive rows end to end); per exchange every
  client fills a [|U|, d] buffer and MPI_Reduce sums it (partial sums may be added on other
  client ranks), then the same Scatterv.
* reduce, star: the dense [n_S, d] buffer of every S-position (MPI_Reduce, or Gather summed at
  the server in client order), then Scatterv of each owner's whole segment.

Memory: every exchange runs in chunks of consecutive rows whose buffers (a client's send rows
and reduce buffer, the server's gathered rows and sums, the scattered rows) fit the row budget
``buffer_bytes / (max width * itemsize)``. All ranks agree on the chunks before the first
collective: the dense modes derive them from n_S, the compact ones get them from the server,
which alone knows how many senders touch each row. A chunk holds at least one row.

The operator is self-adjoint over all clients (DESIGN.md section 1), so the backward pass is the
same exchange applied to the gradient, with the same plan and chunks.

``--secure`` (compact only): the terms travel as masked fixed-point words in Z_2^k, summed in
the ring by the server; each owner removes the masks (mpifgl.secure, docs/privacy.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
import torch

from mpifgl import ring as ring_words
from mpifgl.communicator import Communicator
from mpifgl.graph import CrossExchangePlan, CSRArrays
from mpifgl.secure import (EMPTY_EXPONENT, ExchangeMasks, SecureSession, ceil_exponent,
                           exponent_word, largest_exponent, ring_of, scale_exponent,
                           word_exponent)

MODES = ("compact", "compact-reduce", "reduce", "star")
COMPACT_MODES = ("compact", "compact-reduce")

# (plan, y [|S_i|, d]) -> this client's cross sum [|S_i|, d]; collective
ExchangeFn = Callable[[CrossExchangePlan, torch.Tensor], torch.Tensor]


@dataclass
class Routing:
    """What one rank knows of a plan's chunks after ``CrossClientExchange.prepare``.

    The summed rows are indexed in "sum space": S-positions for the dense modes, positions in U
    for the compact ones. Owner j's rows are sum rows ``owner_start[j]..owner_start[j+1]``."""

    position_bounds: np.ndarray  # int64 [k+1]: chunk c covers S-positions [b[c], b[c+1])
    row_bounds: np.ndarray  # int64 [k+1]: ... and sum rows [r[c], r[c+1])
    owner_start: np.ndarray  # int64 [m+1]
    # a client's side
    send_bounds: np.ndarray  # int64 [k+1]: its touched rows of chunk c are [s[c], s[c+1])
    send_sum_rows: np.ndarray | None  # int64 [t_i]: sum row of each touched row (buffer modes)
    # the server's side (compact): every client's rows per chunk, and per chunk the 0/1 matrix
    # [chunk sum rows, gathered rows] that adds the gathered rows up in client order
    sender_bounds: np.ndarray | None = None  # int64 [m, k+1]
    sum_matrices: list[CSRArrays] | None = None
    masks: ExchangeMasks | None = None  # --secure, a client's side

    @property
    def num_chunks(self) -> int:
        return int(self.row_bounds.shape[0]) - 1

    def gathered_rows(self, c: int) -> np.ndarray:
        """Per rank, how many rows it sends in chunk c's Gatherv (0 for the server); server only."""
        return self._gathered[c]

    def owned_rows(self, c: int) -> np.ndarray:
        """Per owner, how many of its sum rows chunk c holds."""
        return self._owned[c]

    # once per plan, not per exchange: every layer and direction asks for the same counts
    @cached_property
    def _gathered(self) -> np.ndarray:  # [k, size]
        per_sender = np.diff(self.sender_bounds, axis=1).T
        return _read_only(np.concatenate([np.zeros((per_sender.shape[0], 1), np.int64),
                                          per_sender], axis=1))

    @cached_property
    def _owned(self) -> np.ndarray:  # [k, m]
        low, high = self.row_bounds[:-1, None], self.row_bounds[1:, None]
        return _read_only(np.clip(self.owner_start[None, 1:], low, high)
                          - np.clip(self.owner_start[None, :-1], low, high))

    def first_owned_row(self, c: int, owner: int) -> int:
        """Index, among ``owner``'s sum rows, of its first row in chunk c."""
        start = int(self.owner_start[owner])
        return max(int(self.row_bounds[c]), start) - start


def chunk_bounds(cost: np.ndarray, budget: int) -> np.ndarray:
    """Cut rows 0..len(cost) into consecutive chunks whose costs add up to at most ``budget``
    (a single row costing more gets a chunk of its own) -> int64 [k+1] bounds, [0] if no rows."""
    cumulative = np.concatenate([[0], np.cumsum(cost, dtype=np.int64)])
    bounds = [0]
    while bounds[-1] < cost.shape[0]:
        start = bounds[-1]
        end = int(np.searchsorted(cumulative, cumulative[start] + budget, side="right")) - 1
        bounds.append(max(end, start + 1))
    return np.asarray(bounds, dtype=np.int64)


class CrossClientExchange:
    """One rank's side of every cross-client exchange of a run (a callable ExchangeFn).

    ``prepare(plan)`` once per plan (collective), then ``self(plan, y)`` per layer and direction
    (collective; the server passes y of shape [0, d])."""

    def __init__(self, comm: Communicator, mode: str, buffer_bytes: int, max_width: int,
                 dtype: np.dtype, masking: SecureSession | None = None):
        if mode not in MODES:
            raise ValueError(f"--exchange {mode!r}, expected one of {', '.join(MODES)}")
        if masking is not None and mode != "compact":
            raise ValueError(f"--secure with --exchange {mode!r}: expected --exchange compact")
        self.comm = comm
        self.mode = mode
        self.dtype = np.dtype(dtype)
        self.masking = masking
        self._pass, self._calls = "exchange", 0  # --secure: the slot of the next exchange
        # what travels and what the server adds: ring words when masked, else the floats
        self.wire_dtype = ring_of(self.dtype) if masking is not None else self.dtype
        # rows of the widest exchange that fit the buffer cap
        self.row_budget = max(1, int(buffer_bytes) // (max(1, max_width) * self.dtype.itemsize))
        self.id_budget = max(1, int(buffer_bytes) // (8 * comm.size))  # ids per rank per round

    # -- once per plan --------------------------------------------------------------------------
    def prepare(self, plan: CrossExchangePlan) -> None:
        """Agree on the chunks of ``plan`` (compact modes: send the touched row ids to the server,
        which checks them against the owners' counts and broadcasts the chunk bounds)."""
        with self.comm.counting_exchange():
            if self.mode in COMPACT_MODES:
                plan.routing = self._prepare_compact(plan)
            else:
                plan.routing = self._prepare_dense(plan)
        if self.masking is not None and not self.comm.is_server:
            routing, own = plan.routing, plan.own_segment
            receive_chunks = [(routing.first_owned_row(c, own), int(routing.owned_rows(c)[own]))
                              for c in range(routing.num_chunks)]
            routing.masks = self.masking.exchange_masks(plan, receive_chunks)

    def _prepare_dense(self, plan: CrossExchangePlan) -> Routing:
        total = int(plan.segment_rows.sum())
        # reduce: a send buffer and the product rows on a client; star: the server gathers
        # every rank's chunk and holds their sum
        buffers_per_row = 2 if self.mode == "reduce" else self.comm.size + 1
        rows_per_chunk = max(1, self.row_budget // buffers_per_row)
        bounds = np.append(np.arange(0, total, rows_per_chunk, dtype=np.int64), total)
        if total == 0:
            bounds = np.zeros(1, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(plan.segment_rows)]).astype(np.int64)
        return Routing(bounds, bounds, starts, np.searchsorted(plan.touched, bounds),
                       plan.touched)

    def _prepare_compact(self, plan: CrossExchangePlan) -> Routing:
        comm = self.comm
        total = int(plan.segment_rows.sum())
        id_dtype = np.int32 if total < 2 ** 31 else np.int64
        counts = comm.allgather_rows(np.asarray([plan.touched.shape[0],
                                                 plan.receive_rows.shape[0]], dtype=np.int64))
        touched_counts, receive_counts = counts[1:, 0], counts[1:, 1]
        owner_start = np.concatenate([[0], np.cumsum(receive_counts)]).astype(np.int64)
        rounds = -(-int(touched_counts.max(initial=0)) // self.id_budget)
        # the ids, in rounds of at most id_budget per rank (bounded buffers and MPI counts)
        pieces: list[list[np.ndarray]] = [[] for _ in touched_counts]
        for r in range(rounds):
            low = r * self.id_budget
            mine = plan.touched[low:low + self.id_budget].astype(id_dtype)
            per_rank = np.clip(np.concatenate([[0], touched_counts]) - low, 0, self.id_budget)
            flat = comm.gatherv(mine, per_rank if comm.is_server else None)
            if flat is not None:
                cuts = np.cumsum(per_rank)
                for j in range(touched_counts.shape[0]):
                    pieces[j].append(flat[cuts[j]:cuts[j + 1]])
        server_side = self._server_routing(pieces, plan, receive_counts) if comm.is_server else None
        bounds = comm.broadcast_array(server_side[0] if server_side is not None else None)
        if bounds.shape[0] == 0:
            raise ValueError("the server found the clients' touched rows inconsistent with the "
                             "owners' cross blocks (A_ij != A_ji^T in the shards?)")
        position_bounds, row_bounds = bounds.reshape(2, -1)
        sum_rows = None
        if self.mode == "compact-reduce":
            sum_rows = self._scatter_sum_rows(server_side, touched_counts, plan, id_dtype, rounds)
        routing = Routing(position_bounds, row_bounds, owner_start,
                          np.searchsorted(plan.touched, position_bounds), sum_rows)
        if server_side is not None:
            routing.sender_bounds = server_side[2]
            if self.mode == "compact":
                routing.sum_matrices = self._sum_matrices(server_side[1], server_side[2],
                                                          row_bounds, owner_start)
        return routing

    def _server_routing(self, pieces: list[list[np.ndarray]], plan: CrossExchangePlan,
                        receive_counts: np.ndarray):
        """The server's plan: the union U of touched rows, chunk bounds by cost, and every
        sender's rows in U. Returns (bounds [2(k+1)] or [] on inconsistency, rows, cuts)."""
        # ids keep the type they travelled in (int32 while n_S < 2^31): the server's set-up
        # memory for a full-graph plan is a few copies of every sender's ids
        id_dtype = pieces[0][0].dtype if pieces and pieces[0] else np.int64
        ids = [np.concatenate(p) if p else np.zeros(0, id_dtype) for p in pieces]
        union, senders_per_row = np.unique(np.concatenate(ids) if ids else np.zeros(0, id_dtype),
                                           return_counts=True)
        segment_start = np.concatenate([[0], np.cumsum(plan.segment_rows)]).astype(np.int64)
        owner = np.searchsorted(segment_start, union, side="right") - 1
        per_owner = np.bincount(owner, minlength=receive_counts.shape[0])
        if not np.array_equal(per_owner, receive_counts):
            return np.zeros(0, np.int64), None, None
        # compact: the gathered rows of every sender and the sum; compact-reduce: the reduce
        # buffer and the product rows on a client
        cost = senders_per_row + 1 if self.mode == "compact" else np.full(union.shape, 2)
        row_bounds = chunk_bounds(cost, self.row_budget)
        position_bounds = np.append(union[row_bounds[:-1]], int(segment_start[-1]))
        if union.shape[0] == 0:
            position_bounds = np.zeros(1, dtype=np.int64)
        sender_rows = [np.searchsorted(union, s) for s in ids]
        sender_bounds = np.stack([np.searchsorted(r, row_bounds) for r in sender_rows]) \
            if sender_rows else np.zeros((0, row_bounds.shape[0]), np.int64)
        return np.concatenate([position_bounds, row_bounds]), sender_rows, sender_bounds

    def _sum_matrices(self, sender_rows: list[np.ndarray], sender_bounds: np.ndarray,
                      row_bounds: np.ndarray, owner_start: np.ndarray) -> list[CSRArrays]:
        """Per chunk, the matrix that adds the gathered rows (client-major, as Gatherv lays them
        out) into the chunk's sum rows. Its CSR kernel adds each row's entries in client order
        starting from zero, like a loop of fancy-index additions but without their gather and
        scatter passes; the stable sort keeps the client order within a row.

        --secure: chunk 0's messages carry a head row per client each way (the exponent word),
        so its matrix skips each sender's head row and leaves an empty row before each owner's
        rows (the server writes the head there): no copy of the words to take heads out or in."""
        heads = self.masking is not None
        matrices = []
        total = max([int(np.diff(sender_bounds[:, c:c + 2]).sum())
                     for c in range(row_bounds.shape[0] - 1)], default=0)
        ones = np.ones(total, dtype=self.wire_dtype)
        for c in range(row_bounds.shape[0] - 1):
            low, rows = int(row_bounds[c]), int(row_bounds[c + 1] - row_bounds[c])
            target = np.concatenate([r[sender_bounds[j, c]:sender_bounds[j, c + 1]]
                                     for j, r in enumerate(sender_rows)]) - low
            columns = int(target.shape[0])
            if heads and c == 0:
                sender = np.repeat(np.arange(len(sender_rows)),
                                   np.diff(sender_bounds[:, c:c + 2])[:, 0])
                owner = np.searchsorted(owner_start, target + low, side="right") - 1
                target = target + owner + 1  # each owner's rows after its head row
                rows, columns = rows + len(sender_rows), columns + len(sender_rows)
            order = np.argsort(target, kind="stable")
            indptr = np.zeros(rows + 1, dtype=np.int64)
            np.cumsum(np.bincount(target, minlength=rows), out=indptr[1:])
            if heads and c == 0:
                order = order + sender[order] + 1  # gathered rows after each sender's head row
            matrices.append(CSRArrays(indptr, order, ones[:order.shape[0]],
                                      (rows, columns)).compact_indices())
        return matrices

    def _scatter_sum_rows(self, server_side, touched_counts: np.ndarray, plan: CrossExchangePlan,
                          id_dtype, rounds: int) -> np.ndarray:
        """compact-reduce: every client learns the row in U of each of its touched rows."""
        comm = self.comm
        received = []
        for r in range(rounds):
            low = r * self.id_budget
            per_rank = np.clip(np.concatenate([[0], touched_counts]) - low, 0, self.id_budget)
            send = None
            if server_side is not None:
                send = np.concatenate([rows[low:low + self.id_budget] for rows in server_side[1]]
                                      ).astype(id_dtype)
            received.append(comm.scatterv(send, per_rank if comm.is_server else None,
                                          int(per_rank[comm.rank]), id_dtype))
        return (np.concatenate(received).astype(np.int64) if received
                else np.zeros(plan.touched.shape[0], np.int64))

    # -- one exchange ---------------------------------------------------------------------------
    def __call__(self, plan: CrossExchangePlan, y: torch.Tensor) -> torch.Tensor:
        """y [|S_i|, d] (the server: [0, d]) -> sum over other clients of their terms for this
        client's rows [|S_i|, d] (the server: [0, d])."""
        result = np.zeros(tuple(y.shape), dtype=self.dtype)
        self._exchange(plan, y, result, add=False)
        return torch.from_numpy(result)

    def add_into(self, plan: CrossExchangePlan, y: torch.Tensor, total: torch.Tensor) -> None:
        """total += the cross sum of y, in place (collective): the evaluation's full-graph
        forward then needs no [|S_i|, d] result of its own. Same additions as total + self(y)."""
        self._exchange(plan, y, total.numpy(), add=True)

    def _exchange(self, plan: CrossExchangePlan, y: torch.Tensor, result: np.ndarray,
                  add: bool) -> None:
        routing = plan.routing
        assert routing is not None, "prepare(plan) must run before the plan's first exchange"
        values = np.ascontiguousarray(y.detach().numpy(), dtype=self.dtype)
        width = values.shape[1]
        # compact modes: an owner's sum rows are its receive rows; dense: all its rows
        receive_rows = plan.receive_rows if self.mode in COMPACT_MODES else None
        with self.comm.counting_exchange():
            if self.masking is not None:
                self._masked_exchange(plan, values, result, receive_rows, add)
                return
            for c in range(routing.num_chunks):
                summed = self._sum_chunk(plan, routing, c, values)
                self._scatter_chunk(routing, c, summed, result, receive_rows, plan.own_segment,
                                    width, add)

    def _send_rows(self, plan: CrossExchangePlan, routing: Routing, c: int,
                   values: np.ndarray) -> np.ndarray:
        """This client's terms for chunk c's touched rows [rows, d] (a row slice of the
        send matrix times y); [0, d] on the server."""
        low, high = routing.send_bounds[c], routing.send_bounds[c + 1]
        if plan.send_rows is None or high == low:
            return np.zeros((int(high - low), values.shape[1]), dtype=self.dtype)
        return plan.send_rows.row_slice(int(low), int(high)).matmul(values)

    def _sum_chunk(self, plan: CrossExchangePlan, routing: Routing, c: int,
                   values: np.ndarray) -> np.ndarray | None:
        """The sums of chunk c's rows [rows, d] at the server, None elsewhere."""
        comm, width = self.comm, values.shape[1]
        low, high = int(routing.row_bounds[c]), int(routing.row_bounds[c + 1])
        rows = self._send_rows(plan, routing, c, values)
        if self.mode == "compact":
            counts = None
            if comm.is_server:
                counts = routing.gathered_rows(c) * width
            flat = comm.gatherv(rows, counts)
            if flat is None:
                return None
            return routing.sum_matrices[c].matmul(flat.reshape(-1, width))
        buffer = np.zeros((high - low, width), dtype=self.dtype)
        if rows.shape[0]:
            first, last = routing.send_bounds[c], routing.send_bounds[c + 1]
            buffer[routing.send_sum_rows[first:last] - low] = rows
        if self.mode == "star":
            gathered = comm.gather_equal(buffer)
            return (None if gathered is None else
                    np.ascontiguousarray(gathered[1:].sum(axis=0, dtype=self.dtype)))
        return comm.reduce_sum(buffer)

    def _scatter_chunk(self, routing: Routing, c: int, summed: np.ndarray | None,
                       result: np.ndarray, receive_rows: np.ndarray | None, own: int,
                       width: int, add: bool) -> None:
        """Send each owner its rows of chunk c; this client writes (or adds) its rows into
        ``result``."""
        per_owner = routing.owned_rows(c)
        counts = np.concatenate([[0], per_owner]) * width
        mine = int(per_owner[own]) if own >= 0 else 0
        received = self.comm.scatterv(summed, counts if self.comm.is_server else None,
                                      mine * width, self.dtype)
        if mine:
            first = routing.first_owned_row(c, own)
            rows = (slice(first, first + mine) if receive_rows is None
                    else receive_rows[first:first + mine])
            _store(result, rows, received.reshape(mine, width), add)

    # -- --secure: masked ring words, lagged exponents -----------------------------------------
    def start_pass(self, purpose: str) -> None:
        """A forward (and backward) pass begins: with --secure its exchanges are the slots
        (purpose, 0), (purpose, 1), ... (training: layers 1..L forward, then L..1 backward),
        each keeping its exponent from one pass to the next."""
        self._pass, self._calls = purpose, 0

    def _masked_exchange(self, plan: CrossExchangePlan, values: np.ndarray, result: np.ndarray,
                         receive_rows: np.ndarray, add: bool) -> None:
        """The compact exchange in the ring with the slot's lagged range. Chunk 0 carries a head
        row each way: each sender's needed exponent up, the largest of them down; every rank so
        learns the slot's next range and whether this attempt's range was exceeded, in which
        case every rank runs the whole exchange again (the key streams reading on) before
        writing anything."""
        masking, routing = self.masking, plan.routing
        slot = (self._pass, self._calls)
        self._calls += 1
        if routing.num_chunks == 0:  # no cross-client row anywhere (every rank knows)
            return
        first_rows = self._send_rows(plan, routing, 0, values)
        if routing.num_chunks == 1 or routing.masks is None:
            needed = largest_exponent(first_rows)
        else:  # a bound rather than every chunk's terms computed twice
            bound = routing.masks.term_bound * float(np.max(np.abs(values), initial=0.0))
            needed = ceil_exponent(bound * (1 + 2.0 ** -10)) if bound else EMPTY_EXPONENT
        used = masking.exchange_range(self.comm, slot, needed)
        while True:
            exponent = scale_exponent(self.wire_dtype, masking.num_clients, used)
            for c in range(routing.num_chunks):
                rows = first_rows if c == 0 else self._send_rows(plan, routing, c, values)
                summed, largest = self._masked_sum_chunk(routing, c, rows, exponent, needed,
                                                         needed <= used)
                largest = self._masked_scatter_chunk(routing, c, summed, largest, used,
                                                     exponent, result, receive_rows,
                                                     plan.own_segment, values.shape[1], add)
                if c == 0 and masking.settle(slot, largest, used):
                    used = largest
                    break
            else:
                return

    def _masked_sum_chunk(self, routing: Routing, c: int, rows: np.ndarray, exponent: int,
                          needed: int, in_range: bool) -> tuple[np.ndarray | None, int | None]:
        """Chunk c's masked ring sums at the server (None elsewhere; chunk 0 with an empty head
        row before each owner's rows) and, for chunk 0, the largest exponent the senders report
        (at the server) in the first word of their head rows."""
        comm, width = self.comm, rows.shape[1]
        head = 1 if c == 0 else 0
        counts = None
        if comm.is_server:
            send = np.zeros(0, dtype=self.wire_dtype)
            counts = routing.gathered_rows(c) * width
            counts[1:] += head * width  # every client's head row
        else:
            send = np.empty((head + rows.shape[0]) * width, dtype=self.wire_dtype)
            if head:
                send[:width] = 0
                send[:1] = exponent_word(needed, self.wire_dtype)
            # one chunk: ``needed`` is these very terms' exponent, so it proves their range
            self.masking.mask_rows(routing.masks, int(routing.send_bounds[c]), rows, exponent,
                                   self.wire_dtype, in_range, out=send[head * width:],
                                   largest=needed if routing.num_chunks == 1 else None)
        flat = comm.gatherv(send, counts)
        if flat is None:
            return None, None
        gathered = flat.reshape(-1, width)
        largest = None
        if head:
            head_rows = (np.cumsum(counts) - counts)[1:] // width  # each client's first row
            largest = int(np.max(word_exponent(gathered[head_rows, 0]), initial=EMPTY_EXPONENT))
        pattern = routing.sum_matrices[c]
        return ring_words.sum_selected_rows(pattern.indptr, pattern.indices, gathered), largest

    def _masked_scatter_chunk(self, routing: Routing, c: int, summed: np.ndarray | None,
                              largest: int | None, used: int, exponent: int,
                              result: np.ndarray, receive_rows: np.ndarray, own: int, width: int,
                              add: bool) -> int | None:
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
                summed[head_rows, 0] = exponent_word(largest, self.wire_dtype)[0]
        mine = int(per_owner[own]) if own >= 0 else 0
        received = self.comm.scatterv(send, counts if self.comm.is_server else None,
                                      int(counts[self.comm.rank]), self.wire_dtype)
        if head and not self.comm.is_server:
            largest, received = int(word_exponent(received[:1])[0]), received[width:]
        if mine:
            # the scattered words are this rank's own buffer: unmasked in place. A failed
            # attempt (chunk 0 beyond the range) reads its streams too, so that every sender's
            # key stream and this owner's copy stay at the same byte, but stores nothing.
            first = routing.first_owned_row(c, own)
            targets = receive_rows[first:first + mine] if c > 0 or largest <= used else None
            self.masking.unmask_rows(routing.masks, c, received.reshape(mine, width), exponent,
                                     result, targets, add)
        return largest


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _store(result: np.ndarray, rows, block: np.ndarray, add: bool) -> None:
    """result[rows] = block, or += block for the in-place evaluation forward."""
    if add:
        result[rows] += block
    else:
        result[rows] = block


class _CrossClientSum(torch.autograd.Function):
    """sum_{j != i} A_ij[S_i, S_j] y_j. Self-adjoint over all clients, so backward = the same
    exchange applied to the incoming gradient (DESIGN.md section 1)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, plan: CrossExchangePlan, exchange: ExchangeFn):  # type: ignore[override]
        ctx.plan, ctx.exchange = plan, exchange
        return exchange(plan, y.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        with torch.no_grad():
            return ctx.exchange(ctx.plan, grad.contiguous()), None, None


def cross_client_sum(y: torch.Tensor, plan: CrossExchangePlan, exchange: ExchangeFn) -> torch.Tensor:
    return _CrossClientSum.apply(y, plan, exchange)


def add_cross_client_sum(total: torch.Tensor, y: torch.Tensor, plan: CrossExchangePlan,
                         exchange: ExchangeFn) -> None:
    """total += cross_client_sum(y), without autograd. The program's exchange adds in place;
    any other ExchangeFn (a benchmark's or a test's stand-in) returns its sum to add."""
    if isinstance(exchange, CrossClientExchange):
        exchange.add_into(plan, y, total)
    else:
        total += exchange(plan, y)


def dense_terms(plan: CrossExchangePlan, y: torch.Tensor) -> torch.Tensor:
    """This client's terms for every S-position [n_S, d] (zeros where it touches nothing): what
    the dense modes send in one piece. For in-process simulations and tests."""
    dense = torch.zeros((int(plan.segment_rows.sum()), y.shape[1]), dtype=y.dtype)
    if plan.send_rows is not None and plan.touched.shape[0]:
        dense[torch.from_numpy(plan.touched)] = torch.from_numpy(
            plan.send_rows.matmul(y.detach().numpy()))
    return dense
