"""``--exchange compact-reduce``: the compact exchange's row ids, but the sums by MPI_Reduce. The
server answers each client with the positions of its touched rows in the union U of all touched
rows (U = the owners' receive rows end to end); per exchange every client fills a [|U|, d]
buffer (chunk by chunk) and MPI_Reduce sums it (partial sums may be added on other client
ranks, docs/privacy.md), then the same Scatterv as compact.
"""
from __future__ import annotations

import numpy as np
import torch

from mpifgl.exchange.base import Exchange, Routing
from mpifgl.exchange.compact import compact_routing
from mpifgl.graph import CrossExchangePlan


def fill_sum_rows(exchange: Exchange, plan: CrossExchangePlan, routing: Routing, c: int,
                  values: torch.Tensor) -> torch.Tensor:
    """This client's terms of chunk c placed at their sum rows of a zero buffer [rows, d], in
    host memory for MPI."""
    low, high = int(routing.row_bounds[c]), int(routing.row_bounds[c + 1])
    buffer = torch.zeros((high - low, values.shape[1]), dtype=exchange.dtype,
                         device=values.device)
    rows = exchange.send_rows(plan, routing, c, values)
    if rows.shape[0]:
        first, last = routing.send_bounds[c], routing.send_bounds[c + 1]
        buffer[torch.from_numpy(routing.send_sum_rows[first:last] - low).to(buffer.device)] = rows
    return exchange.staging.to_host(buffer)


class CompactReduceExchange(Exchange):
    def route(self, plan: CrossExchangePlan) -> Routing:
        routing, touched_counts, id_dtype = compact_routing(self.comm, plan, self.id_budget,
                                                            self.row_budget, gathered=False)
        routing.send_sum_rows = self._scatter_sum_rows(routing, touched_counts, plan, id_dtype)
        return routing

    def _scatter_sum_rows(self, routing: Routing, touched_counts: np.ndarray,
                          plan: CrossExchangePlan, id_dtype: torch.dtype) -> np.ndarray:
        """Every client learns the row in U of each of its touched rows."""
        comm = self.comm
        rounds = -(-int(touched_counts.max(initial=0)) // self.id_budget)
        received = []
        for r in range(rounds):
            low = r * self.id_budget
            per_rank = np.clip(np.concatenate([[0], touched_counts]) - low, 0, self.id_budget)
            send = None
            if comm.is_server:
                send = torch.from_numpy(np.concatenate(
                    [rows[low:low + self.id_budget] for rows in routing.sender_rows])).to(id_dtype)
            received.append(comm.scatterv(send, per_rank if comm.is_server else None,
                                          int(per_rank[comm.rank]), id_dtype).numpy())
        return (np.concatenate(received).astype(np.int64) if received
                else np.zeros(plan.touched.shape[0], np.int64))

    def owner_rows(self, plan: CrossExchangePlan) -> np.ndarray:
        return plan.receive_rows

    def sum_chunk(self, plan, routing, c, values):
        return self.comm.reduce_sum(fill_sum_rows(self, plan, routing, c, values))
