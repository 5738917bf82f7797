"""The cross-client exchange: the sum over other clients of their terms A_ij y_j, forward and
backward, through the server. No mpi4py here: every message goes through a Communicator.

For one sample S (or the full graph), client i's terms for every client are the rows of
``send = A_i,cross[S_i, S]^T y_i`` [n_S, d], laid out by S-position (client-ordered sampled
rows, ``graph.sample_columns``). Only the rows some own node is adjacent to are non-zero:
``plan.touched`` (t_i rows). Owner j needs the sum of all clients' rows of its segment; the rows
of that sum that can be non-zero are its own sampled nodes with a cross edge into S,
``plan.receive_rows`` (u_j rows), which j knows from its own cross block (A_ji = A_ij^T).

One module per mode (``mpifgl.registry.EXCHANGES`` lists them, ``docs/training.md`` says what
each moves and when each wins): ``compact`` (the default), ``compact_reduce``, ``dense``
(``reduce`` and ``star``), all ``base.Exchange``; ``--secure`` wraps the compact one
(``masked.MaskedExchange``). ``build_exchange`` picks one.

``CrossClientSums`` connects an exchange to a model: it attaches one hook per propagation of
every layer (``mpifgl.model.CrossSum``), numbering them in the order a forward pass runs them.
That schedule is the one contract between ranks: a client's autograd runs the hooks forward in
schedule order and backward in reverse (the operator is self-adjoint over all clients,
docs/design.md section 1, so backward is the same exchange of the gradient), the server, which
runs no model, follows the same schedule (``server_pass``), and --secure's slots are its entries.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mpifgl.exchange.base import Exchange, Routing, Slot, chunk_bounds
from mpifgl.graph import CrossExchangePlan
from mpifgl.operators import SparseOperator
from mpifgl.registry import EXCHANGES, lookup

if TYPE_CHECKING:
    from mpifgl.model import GNN
    from mpifgl.secure import SecureSession
    from mpifgl.communicator import Communicator

__all__ = ["CrossClientSums", "Exchange", "Routing", "Slot", "WIRE_TYPES", "build_exchange",
           "chunk_bounds"]

# --wire-dtype's 16-bit choices ("same" is absent: the run's own dtype)
WIRE_TYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def build_exchange(comm: "Communicator", mode: str, buffer_bytes: int, max_width: int,
                   dtype: torch.dtype, masking: "SecureSession | None" = None,
                   wire_dtype: torch.dtype | None = None):
    """This rank's exchange of ``--exchange mode``, masked when a session is given; its values
    on the wire in ``wire_dtype`` (default ``dtype``; another only where the server, not MPI,
    sums: ``Entry.narrow_wire``)."""
    entry = lookup(EXCHANGES, "exchange", mode)
    if wire_dtype not in (None, dtype) and not entry.narrow_wire:
        raise ValueError(f"--wire-dtype with --exchange {mode!r}: expected --exchange one of "
                         f"{', '.join(n for n, e in EXCHANGES.items() if e.narrow_wire)}")
    exchange = entry.load()(comm, buffer_bytes, max_width, dtype, wire_dtype)
    if masking is None:
        return exchange
    if not entry.maskable:
        raise ValueError(f"--secure with --exchange {mode!r}: expected --exchange one of "
                         f"{', '.join(n for n, e in EXCHANGES.items() if e.maskable)}")
    from mpifgl.exchange.masked import MaskedExchange
    return MaskedExchange(exchange, masking)


class CrossClientSums:
    """One rank's cross-client sums of one model through one exchange (collective calls)."""

    def __init__(self, exchange: Exchange):
        self.exchange = exchange
        self.widths: list[int] = []  # of each propagation, in forward order: the schedule
        self.purpose = "train"
        self._next_forward = 0
        self._next_backward = -1

    def attach(self, model: "GNN", first: int = 0) -> None:
        """Give every propagation of ``model``'s layers from layer ``first`` on its hook,
        numbered in forward order (layers before ``first`` do not propagate per step)."""
        self.widths = []
        for layer in list(model.layers)[first:]:
            hooks = []
            for width in layer.propagated_widths():
                hooks.append(_Hook(self, len(self.widths)))
                self.widths.append(width)
            layer.cross_sums = hooks

    def prepare(self, plan: CrossExchangePlan | None) -> None:
        """Agree on a new plan's chunks with every rank (collective; once per operator)."""
        if plan is not None:
            self.exchange.prepare(plan)

    def start_pass(self, purpose: str) -> None:
        """A forward (and backward) pass begins: its sums are the slots (purpose, direction,
        index) of the schedule (--secure keeps each slot's range from one pass to the next)."""
        self.purpose = purpose
        self._next_forward, self._next_backward = 0, len(self.widths) - 1

    def once(self, plan: CrossExchangePlan, y: torch.Tensor, total: torch.Tensor,
             purpose: str = "setup", index: int = 0) -> None:
        """A sum outside the schedule (collective; the server passes y of shape [0, d]): total
        += the sum of y's cross-client terms. ``--exact-first-layer``'s input once per run
        ("setup"); ``--history-every``'s hidden inputs at each refresh ("history", one index
        per layer: --secure keeps a range per slot)."""
        self.exchange.run(plan, y, (purpose, "forward", index), total)

    def server_pass(self, plan: CrossExchangePlan, backward: bool) -> None:
        """The server's side of one forward pass (and, training, its backward): every sum of
        the schedule in the order the clients' autograd runs them, with no rows of its own."""
        for index, width in enumerate(self.widths):
            self.run(plan, torch.zeros((0, width), dtype=self.exchange.dtype), "forward", index)
        if backward:
            for index in reversed(range(len(self.widths))):
                self.run(plan, torch.zeros((0, self.widths[index]), dtype=self.exchange.dtype),
                         "backward", index)

    def run(self, plan: CrossExchangePlan, y: torch.Tensor, direction: str, index: int,
            total: torch.Tensor | None = None) -> torch.Tensor:
        self._check_order(direction, index)
        return self.exchange.run(plan, y, (self.purpose, direction, index), total)

    def _check_order(self, direction: str, index: int) -> None:
        """Every rank must run the schedule in the same order, or the collectives mismatch."""
        if direction == "forward":
            expected, self._next_forward = self._next_forward, self._next_forward + 1
        else:
            expected, self._next_backward = self._next_backward, self._next_backward - 1
        if index != expected:
            raise RuntimeError(f"cross-client sum {index} ran {direction} where sum {expected} "
                               f"of the schedule was due: every rank must run the layers' "
                               f"propagations in one order (forward in layer order)")


class _Hook:
    """``mpifgl.model.CrossSum`` of one propagation: its index in the schedule."""

    def __init__(self, sums: CrossClientSums, index: int):
        self.sums = sums
        self.index = index

    def propagate(self, inner: SparseOperator, plan: CrossExchangePlan,
                  y: torch.Tensor) -> torch.Tensor:
        return _InnerAndCrossSum.apply(y, inner, plan, self)

    def add_into(self, plan: CrossExchangePlan, y: torch.Tensor, total: torch.Tensor) -> None:
        self.sums.run(plan, y, "forward", self.index, total)


class _InnerAndCrossSum(torch.autograd.Function):
    """A_ii y + sum_{j != i} A_ij[S_i, S_j] y_j, the exchange's sum added into the inner
    product in place: one [k, d] result each way where a product and a sum were two. The
    operator is self-adjoint over all clients, so backward is the inner block's transpose and the
    same exchange applied to the incoming gradient."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, inner: SparseOperator,  # type: ignore[override]
                plan: CrossExchangePlan, hook: _Hook):
        ctx.inner, ctx.plan, ctx.hook = inner, plan, hook
        values = y.detach()
        return hook.sums.run(plan, values, "forward", hook.index,
                             inner.forward_matrix.matmul(values))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        with torch.no_grad():
            grad = grad.contiguous()
            total = ctx.inner.transpose_matrix.matmul(grad)
            return (ctx.hook.sums.run(ctx.plan, grad, "backward", ctx.hook.index, total),
                    None, None, None)
