"""The dense exchanges: every client sends a buffer of every S-position of a chunk [rows, d]
(zeros where it touches nothing); each owner gets its whole segment back (Scatterv).

* ``--exchange reduce``: MPI_Reduce sums the buffers (partial sums may be added on other client
  ranks, docs/privacy.md);
* ``--exchange star``: Gather to the server, which sums in client order; no client relays.

The chunks follow from n_S alone, so every rank derives them without a message.
"""
from __future__ import annotations

import numpy as np
import torch

from mpifgl.exchange.base import Exchange, Routing
from mpifgl.exchange.compact_reduce import fill_sum_rows
from mpifgl.graph import CrossExchangePlan


class DenseExchange(Exchange):
    def route(self, plan: CrossExchangePlan) -> Routing:
        total = int(plan.segment_rows.sum())
        rows_per_chunk = max(1, self.row_budget // self.buffers_per_row(self.comm.size))
        bounds = np.append(np.arange(0, total, rows_per_chunk, dtype=np.int64), total)
        if total == 0:
            bounds = np.zeros(1, dtype=np.int64)
        return Routing(bounds, bounds, plan.segment_start, np.searchsorted(plan.touched, bounds),
                       plan.touched)

    @staticmethod
    def buffers_per_row(world_size: int) -> int:
        """[rows, d] buffers of a chunk that the busiest rank holds at once."""
        raise NotImplementedError


class ReduceExchange(DenseExchange):
    @staticmethod
    def buffers_per_row(world_size: int) -> int:
        return 2  # a client's send buffer and its product rows

    def sum_chunk(self, plan, routing, c, values):
        return self.comm.reduce_sum(fill_sum_rows(self, plan, routing, c, values))


class StarExchange(DenseExchange):
    @staticmethod
    def buffers_per_row(world_size: int) -> int:
        return world_size + 1  # the server gathers every rank's chunk and holds their sum

    def sum_chunk(self, plan, routing, c, values):
        gathered = self.comm.gather_equal(fill_sum_rows(self, plan, routing, c, values))
        if gathered is None:
            return None
        # the server's own (zero) buffer is left out; numpy adds the clients' in rank order
        return torch.from_numpy(np.ascontiguousarray(
            gathered[1:].numpy().sum(axis=0, dtype=gathered.numpy().dtype)))
