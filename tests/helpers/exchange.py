"""In-process stand-ins for the cross-client sum: a client's dense terms, a hook from a plain
function (what a simulated server or a recorder returns), and one exchange of a mode run by
threads (``run_exchange``) with the sums every owner should get (``expected_sums``)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from fgl_common.shard_format import read_manifest
from mpifgl.exchange import build_exchange
from mpifgl.graph import ClientGraph, CrossExchangePlan, build_operator
from tests.helpers.exactness import two_islands_graph
from tests.helpers.graphs import write_shards
from tests.helpers.thread_comm import ThreadWorld

SLOT = ("train", "forward", 0)
# one float64 row of width 5 per chunk where a chunk holds at least one row
ONE_ROW_MB = 1e-6


def dense_terms(plan: CrossExchangePlan, y: torch.Tensor) -> torch.Tensor:
    """This client's terms for every S-position [n_S, d] (zeros where it touches nothing): what
    the dense modes send in one piece."""
    dense = torch.zeros((int(plan.segment_rows.sum()), y.shape[1]), dtype=y.dtype)
    if plan.send_rows is not None and plan.touched.shape[0]:
        dense[torch.from_numpy(plan.touched)] = plan.send_rows.matmul(y.detach())
    return dense


class FunctionHook:
    """``mpifgl.model.CrossSum`` from ``fn(plan, y) -> [k, d]`` (no autograd through fn)."""

    def __init__(self, fn: Callable[[CrossExchangePlan, torch.Tensor], torch.Tensor]):
        self.fn = fn

    def propagate(self, inner, plan: CrossExchangePlan, y: torch.Tensor) -> torch.Tensor:
        return inner @ y + self.fn(plan, y)

    def add_into(self, plan: CrossExchangePlan, y: torch.Tensor, total: torch.Tensor) -> None:
        total += self.fn(plan, y)


def islands_shards(tmp_path):
    """Three clients; client 2 holds a component of its own: it sends and receives nothing."""
    graph, parts = two_islands_graph()
    return write_shards(graph, parts, tmp_path / "islands")


def run_exchange(shard_dir, mode: str, buffer_mb: float, samples, width: int = 5,
                 wire_dtype=None, world=None):
    """Every rank's exchange of ``mode`` on its plan: per client (result, y, plan), from
    ThreadWorld ranks; the server's own result is [0, width]."""
    manifest = read_manifest(shard_dir)
    sizes = manifest.client_sizes()

    def body(comm):
        graph = (ClientGraph.for_rank(str(shard_dir), manifest, comm.client_id))
        exchange = build_exchange(comm, mode, int(buffer_mb * 2 ** 20), width, torch.float64,
                                  wire_dtype=wire_dtype)
        plan = build_operator(graph, "gcn", samples, None, torch.float64, True).exchange
        exchange.prepare(plan)
        rows = plan.send_rows.shape[1] if plan.send_rows is not None else 0
        y = torch.from_numpy(np.random.default_rng(comm.rank).normal(size=(rows, width)))
        result = exchange.run(plan, y, SLOT)
        added = exchange.run(plan, y, SLOT, total=torch.ones_like(y))
        return result, added, y, plan, plan.routing.num_chunks

    return (world or ThreadWorld(len(sizes) + 1)).run(body)


def expected_sums(results) -> list[np.ndarray]:
    """Each client's own segment of the sum over OTHER clients of their dense terms."""
    clients = results[1:]
    starts = clients[0][3].segment_start
    sums = []
    for j in range(len(clients)):
        total = sum(dense_terms(plan, y).numpy() for i, (_, _, y, plan, _) in enumerate(clients)
                    if i != j)
        sums.append(total[starts[j]:starts[j + 1]])
    return sums
