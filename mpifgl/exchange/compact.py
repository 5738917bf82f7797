"""``--exchange compact`` (the default): per plan, each client sends the server its touched row
ids (int32 while n_S < 2^31) once; per exchange, only the values of its touched rows (Gatherv).
The server sums them per row in client order (deterministic) and sends each owner the values of
its receive rows only (Scatterv; the owner knows which rows they are, no ids come back). With
``--wire-dtype`` the values travel in a 16-bit float both ways and are summed in ``--dtype``.

``compact_routing`` (the ids' round trip and the server's chunks) is shared with
``compact-reduce``; ``sum_matrices`` with ``--secure``'s masked exchange.
"""
from __future__ import annotations

import numpy as np
import torch

from fgl_common.arrays import offsets
from mpifgl.communicator import Communicator
from mpifgl.exchange.base import Exchange, Routing, chunk_bounds
from mpifgl.graph import CrossExchangePlan
from mpifgl.hardware import release_free_heap
from mpifgl.operators import CSRArrays, SparseMatrix, unit_values

SUM_MATRICES = "sum_matrices"  # Routing.extra key: the server's per-chunk sum matrices
# From a plan of this many touched ids in all, the server gives its set-up's freed heap back:
# below, the temporaries are too small to pay for the call (docs/hardware.md)
RELEASE_HEAP_MIN_IDS = 1_000_000


def compact_routing(comm: Communicator, plan: CrossExchangePlan, id_budget: int,
                    row_budget: int, gathered: bool) -> tuple[Routing, np.ndarray, torch.dtype]:
    """The chunks of a compact plan: every client's touched row ids go to the server (in rounds
    of at most ``id_budget`` per rank), which checks them against the owners' receive counts,
    cuts the union U of touched rows into chunks of ``row_budget`` buffer rows and broadcasts
    the bounds (``gathered``: the server holds every sender's rows of a chunk and their sum;
    else a reduce buffer and the product rows). Returns (routing, every client's count of
    touched rows, the ids' dtype)."""
    total = int(plan.segment_rows.sum())
    id_dtype = torch.int32 if total < 2 ** 31 else torch.int64
    counts = comm.allgather_rows(torch.tensor([plan.touched.shape[0],
                                               plan.receive_rows.shape[0]])).numpy()
    touched_counts, receive_counts = counts[1:, 0], counts[1:, 1]
    owner_start = offsets(receive_counts)
    rounds = -(-int(touched_counts.max(initial=0)) // id_budget)
    # the ids, in rounds of at most id_budget per rank (bounded buffers and MPI counts)
    pieces: list[list[np.ndarray]] = [[] for _ in touched_counts]
    for r in range(rounds):
        low = r * id_budget
        mine = torch.from_numpy(plan.touched[low:low + id_budget]).to(id_dtype)
        per_rank = np.clip(np.concatenate([[0], touched_counts]) - low, 0, id_budget)
        flat = comm.gatherv(mine, per_rank if comm.is_server else None)
        if flat is not None:
            cuts = offsets(per_rank)[1:]
            for j in range(touched_counts.shape[0]):
                pieces[j].append(flat[cuts[j]:cuts[j + 1]].numpy())
    server_side = None
    if comm.is_server:
        server_side = _server_routing(pieces, plan, receive_counts, row_budget, gathered)
        del pieces
        if int(touched_counts.sum()) >= RELEASE_HEAP_MIN_IDS:
            release_free_heap()  # the set-up's temporaries: not resident through what follows
    bounds = comm.broadcast_array(torch.from_numpy(server_side[0]) if server_side else None)
    if bounds.shape[0] == 0:
        raise ValueError("the server found the clients' touched rows inconsistent with the "
                         "owners' cross blocks (A_ij != A_ji^T in the shards?)")
    position_bounds, row_bounds = bounds.numpy().reshape(2, -1)
    routing = Routing(position_bounds, row_bounds, owner_start,
                      np.searchsorted(plan.touched, position_bounds))
    if server_side is not None:
        routing.sender_rows, routing.sender_bounds = server_side[1], server_side[2]
    return routing, touched_counts, id_dtype


def _server_routing(pieces: list[list[np.ndarray]], plan: CrossExchangePlan,
                    receive_counts: np.ndarray, row_budget: int, gathered: bool):
    """The server's plan: the union U of touched rows, chunk bounds by cost, and every
    sender's rows in U. Returns (bounds [2(k+1)] or [] on inconsistency, rows, cuts)."""
    # ids keep the type they travelled in (int32 while n_S < 2^31): the server's set-up
    # memory for a full-graph plan is a few copies of every sender's ids
    id_dtype = pieces[0][0].dtype if pieces and pieces[0] else np.int64
    ids = [np.concatenate(p) if p else np.zeros(0, id_dtype) for p in pieces]
    segment_start = plan.segment_start
    total = int(segment_start[-1])
    # what the counts below and the sum matrices' counting sort rely on
    if not all(_ascending_in_range(s, total) for s in ids):
        return np.zeros(0, np.int64), None, None
    # U and its senders per row by counting over the S-positions: linear, where np.unique
    # sorts every sender's ids again (the server's set-up of a plan, while the clients wait)
    senders_at = np.zeros(total, dtype=np.int64)
    for s in ids:
        senders_at[s] += 1
    union = np.flatnonzero(senders_at)
    senders_per_row = senders_at[union]
    del senders_at
    owner = np.searchsorted(segment_start, union, side="right") - 1
    per_owner = np.bincount(owner, minlength=receive_counts.shape[0])
    if not np.array_equal(per_owner, receive_counts):
        return np.zeros(0, np.int64), None, None
    cost = senders_per_row + 1 if gathered else np.full(union.shape, 2)
    row_bounds = chunk_bounds(cost, row_budget)
    position_bounds = np.append(union[row_bounds[:-1]], total)
    if union.shape[0] == 0:
        position_bounds = np.zeros(1, dtype=np.int64)
    # S-position -> row of U, read at U only; int32 rows while they fit, as the ids travel
    row_of = np.empty(total, dtype=np.int32 if union.shape[0] < 2 ** 31 else np.int64)
    row_of[union] = np.arange(union.shape[0])
    sender_rows = [row_of[s] for s in ids]
    del row_of
    sender_bounds = np.stack([np.searchsorted(r, row_bounds) for r in sender_rows]) \
        if sender_rows else np.zeros((0, row_bounds.shape[0]), np.int64)
    return np.concatenate([position_bounds, row_bounds]), sender_rows, sender_bounds


def sum_matrices(routing: Routing, heads: bool = False) -> list[CSRArrays]:
    """Per chunk, the matrix that adds the gathered rows (client-major, as Gatherv lays them
    out) into the chunk's sum rows. Its CSR kernel adds each row's entries in client order
    starting from zero, like a loop of fancy-index additions but without their gather and
    scatter passes; the stable sort keeps the client order within a row.

    ``heads`` (--secure): chunk 0's messages carry a head row per client each way (the exponent
    word), so its matrix skips each sender's head row and leaves an empty row before each
    owner's rows (the server writes the head there): no copy of the words to take heads out."""
    sender_rows, sender_bounds = routing.sender_rows, routing.sender_bounds
    row_bounds, owner_start = routing.row_bounds, routing.owner_start
    matrices = []
    chunks = range(row_bounds.shape[0] - 1)
    ones = unit_values(max((int(routing.gathered_rows(c).sum()) for c in chunks), default=0),
                       np.float64)
    for c in chunks:
        low, rows = int(row_bounds[c]), int(row_bounds[c + 1] - row_bounds[c])
        target = np.concatenate([r[sender_bounds[j, c]:sender_bounds[j, c + 1]]
                                 for j, r in enumerate(sender_rows)]) - low
        columns = int(target.shape[0])
        per_sender = routing.gathered_rows(c)[1:]  # the server's entry is 0
        with_heads = heads and c == 0
        if with_heads:
            sender = np.repeat(np.arange(len(sender_rows)), per_sender)
            owner = np.searchsorted(owner_start, target + low, side="right") - 1
            target = target + owner + 1  # each owner's rows after its head row
            rows, columns = rows + len(sender_rows), columns + len(sender_rows)
        indptr = offsets(np.bincount(target, minlength=rows))
        order = _stable_order(target, per_sender, indptr)
        if with_heads:
            order = order + sender[order] + 1  # gathered rows after each sender's head row
        matrices.append(CSRArrays(indptr, order, ones[:order.shape[0]], (rows, columns),
                                  unit=True).compact_indices())
    return matrices


def _ascending_in_range(ids: np.ndarray, total: int) -> bool:
    """A sender's ids strictly ascending (so distinct) and within [0, total)."""
    return ids.shape[0] == 0 or (int(ids[0]) >= 0 and int(ids[-1]) < total
                                 and bool(np.all(ids[1:] > ids[:-1])))


def _stable_order(target: np.ndarray, run_lengths: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """``np.argsort(target, kind="stable")`` for a ``target`` made of consecutive runs (one per
    sender, ``run_lengths``) whose entries are distinct within a run, ``indptr`` its counts'
    offsets: a counting sort, one pass per run, where the sort merges the runs."""
    order = np.empty(target.shape[0], dtype=np.int64)
    next_slot = indptr[:-1].copy()
    bounds = offsets(run_lengths)
    for start, stop in zip(bounds[:-1], bounds[1:]):
        run = target[start:stop]
        order[next_slot[run]] = np.arange(start, stop)
        next_slot[run] += 1  # distinct within the run: one increment per entry
    return order


class CompactExchange(Exchange):
    def route(self, plan: CrossExchangePlan) -> Routing:
        routing, _, _ = compact_routing(self.comm, plan, self.id_budget, self.row_budget,
                                        gathered=True)
        if routing.sender_rows is not None:
            routing.extra[SUM_MATRICES] = [SparseMatrix(m, self.dtype)
                                           for m in sum_matrices(routing)]
            routing.sender_rows = None  # in the matrices now; the counts need only the bounds
        return routing

    def owner_rows(self, plan: CrossExchangePlan) -> np.ndarray:
        return plan.receive_rows

    def sum_chunk(self, plan, routing, c, values):
        width = values.shape[1]
        rows = self.staging.to_host(self.send_rows(plan, routing, c, values).to(self.wire_dtype))
        counts = routing.gathered_rows(c) * width if self.comm.is_server else None
        flat = self.comm.gatherv(rows, counts)
        if flat is None:
            return None
        return routing.extra[SUM_MATRICES][c].matmul(flat.view(-1, width).to(self.dtype))
