"""What every exchange mode shares: the chunks all ranks agree on (``Routing``), the cut of rows
into chunks under the buffer cap (``chunk_bounds``), and the run of one exchange chunk by chunk
(``Exchange.run``): this client's terms of the chunk's rows, the mode's sum at the server, and the
Scatterv of each owner's sums.

A mode is one subclass: how it agrees on the chunks (``route``) and how the server gets the
chunk's sums (``sum_chunk``); its sum rows are either every row of the owners' segments (dense)
or only their receive rows (compact, ``owner_rows``).

Devices: a client's terms are computed where its y lives (a GPU or the CPU), copied to host
memory for MPI through a reused pinned buffer (``HostStaging``), and its sums copied back; the
server's sums run on the host, where MPI delivers the messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from fgl_common.arrays import offsets
from mpifgl.communicator import Communicator
from mpifgl.graph import CrossExchangePlan

# a slot names one use of the exchange: (purpose, direction, index in the schedule)
Slot = tuple[str, str, int]


@dataclass
class Routing:
    """What one rank knows of a plan's chunks after ``Exchange.prepare``.

    The summed rows are indexed in "sum space": S-positions for the dense modes, positions in U
    (the union of touched rows) for the compact ones. Owner j's rows are sum rows
    ``owner_start[j]..owner_start[j+1]``."""

    position_bounds: np.ndarray  # int64 [k+1]: chunk c covers S-positions [b[c], b[c+1])
    row_bounds: np.ndarray  # int64 [k+1]: ... and sum rows [r[c], r[c+1])
    owner_start: np.ndarray  # int64 [m+1]
    # a client's side
    send_bounds: np.ndarray  # int64 [k+1]: its touched rows of chunk c are [s[c], s[c+1])
    send_sum_rows: np.ndarray | None = None  # int64 [t_i]: sum row of each touched row (buffers)
    # the server's side (compact modes): every sender's rows in U, and their bounds per chunk
    sender_rows: list[np.ndarray] | None = None
    sender_bounds: np.ndarray | None = None  # int64 [m, k+1]
    # what a mode or a wrapper adds per plan (the server's sum matrices, --secure's masks)
    extra: dict[str, Any] = field(default_factory=dict)

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


class HostStaging:
    """Host copies of device tensors for MPI, in one pinned buffer per dtype that grows as
    needed (a pinned copy is faster, and no fresh pinned pages per message). A copy is valid
    until the next one of the same dtype: every collective completes before the next starts."""

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu":
            return tensor
        count = tensor.numel()
        buffer = self._buffers.get(tensor.dtype)
        if buffer is None or buffer.numel() < count:
            buffer = torch.empty(max(count, 2 * (0 if buffer is None else buffer.numel())),
                                 dtype=tensor.dtype, pin_memory=True)
            self._buffers[tensor.dtype] = buffer
        host = buffer[:count].view(tensor.shape)
        host.copy_(tensor)
        return host


def chunk_bounds(cost: np.ndarray, budget: int) -> np.ndarray:
    """Cut rows 0..len(cost) into consecutive chunks whose costs add up to at most ``budget``
    (a single row costing more gets a chunk of its own) -> int64 [k+1] bounds, [0] if no rows."""
    cumulative = offsets(cost)
    bounds = [0]
    while bounds[-1] < cost.shape[0]:
        start = bounds[-1]
        end = int(np.searchsorted(cumulative, cumulative[start] + budget, side="right")) - 1
        bounds.append(max(end, start + 1))
    return np.asarray(bounds, dtype=np.int64)


class Exchange:
    """One rank's side of every cross-client exchange of a run, in one mode.

    ``prepare(plan)`` once per plan (collective), then ``run(plan, y, slot)`` per layer and
    direction (collective; the server passes y of shape [0, d]). Memory: every exchange runs in
    chunks whose buffers fit ``buffer_bytes`` (at least one row per chunk)."""

    def __init__(self, comm: Communicator, buffer_bytes: int, max_width: int,
                 dtype: torch.dtype, wire_dtype: torch.dtype | None = None):
        self.comm = comm
        self.dtype = dtype
        # what the terms and sums travel as (--wire-dtype); the sums are made in ``dtype``
        self.wire_dtype = wire_dtype or dtype
        # rows of the widest exchange that fit the buffer cap
        self.row_budget = max(1, int(buffer_bytes) // (max(1, max_width) * dtype.itemsize))
        self.id_budget = max(1, int(buffer_bytes) // (8 * comm.size))  # ids per rank per round
        self.staging = HostStaging()

    # -- once per plan --------------------------------------------------------------------------
    def prepare(self, plan: CrossExchangePlan) -> None:
        """Agree on the chunks of ``plan`` with every rank (collective)."""
        with self.comm.counting_exchange():
            plan.routing = self.route(plan)

    def route(self, plan: CrossExchangePlan) -> Routing:
        raise NotImplementedError

    def owner_rows(self, plan: CrossExchangePlan) -> np.ndarray | None:
        """This owner's rows that its sum rows are (None: all its rows, in order)."""
        return None

    # -- one exchange ---------------------------------------------------------------------------
    def run(self, plan: CrossExchangePlan, y: torch.Tensor, slot: Slot,
            total: torch.Tensor | None = None) -> torch.Tensor:
        """y [|S_i|, d] (the server: [0, d]) -> the sum over other clients of their terms for
        this client's rows [|S_i|, d]; added into ``total`` in place when given (the same
        additions as total + the sum), which is returned."""
        routing = plan.routing
        assert routing is not None, "prepare(plan) must run before the plan's first exchange"
        values = y.detach().contiguous()
        result = (torch.zeros(tuple(y.shape), dtype=self.dtype, device=y.device) if total is None
                  else total)
        with self.comm.counting_exchange():
            self.run_chunks(plan, routing, values, result, add=total is not None, slot=slot)
        return result

    def run_chunks(self, plan: CrossExchangePlan, routing: Routing, values: torch.Tensor,
                 result: torch.Tensor, add: bool, slot: Slot) -> None:
        width, rows = values.shape[1], self.owner_rows(plan)
        for c in range(routing.num_chunks):
            summed = self.sum_chunk(plan, routing, c, values)
            self.scatter_chunk(routing, c, summed, result, rows, plan.own_segment, width, add)

    def send_rows(self, plan: CrossExchangePlan, routing: Routing, c: int,
                  values: torch.Tensor) -> torch.Tensor:
        """This client's terms for chunk c's touched rows [rows, d] (a row slice of the send
        matrix times y); [0, d] on the server."""
        low, high = int(routing.send_bounds[c]), int(routing.send_bounds[c + 1])
        if plan.send_rows is None or high == low:
            return torch.zeros((high - low, values.shape[1]), dtype=self.dtype,
                               device=values.device)
        return plan.send_rows.row_slice(low, high).matmul(values)

    def sum_chunk(self, plan: CrossExchangePlan, routing: Routing, c: int,
                  values: torch.Tensor) -> torch.Tensor | None:
        """The sums of chunk c's rows [rows, d] at the server, None elsewhere."""
        raise NotImplementedError

    def scatter_chunk(self, routing: Routing, c: int, summed: torch.Tensor | None,
                      result: torch.Tensor, receive_rows: np.ndarray | None, own: int,
                      width: int, add: bool) -> None:
        """Send each owner its rows of chunk c; this client writes (or adds) its rows into
        ``result``."""
        per_owner = routing.owned_rows(c)
        counts = np.concatenate([[0], per_owner]) * width
        mine = int(per_owner[own]) if own >= 0 else 0
        received = self.comm.scatterv(None if summed is None else summed.to(self.wire_dtype),
                                      counts if self.comm.is_server else None, mine * width,
                                      self.wire_dtype)
        if mine:
            first = routing.first_owned_row(c, own)
            rows = (slice(first, first + mine) if receive_rows is None
                    else torch.from_numpy(receive_rows[first:first + mine]).to(result.device))
            store(result, rows, received.view(mine, width).to(result.device, self.dtype), add)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def store(result: torch.Tensor, rows: slice | torch.Tensor, block: torch.Tensor,
          add: bool) -> None:
    """result[rows] = block, or += block for the in-place evaluation forward."""
    if add:
        result[rows] += block
    else:
        result[rows] = block
