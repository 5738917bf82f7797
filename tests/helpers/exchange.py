"""In-process stand-ins for the cross-client sum: a client's dense terms, and a hook from a
plain function (what a simulated server or a recorder returns)."""
from __future__ import annotations

from typing import Callable

import torch

from mpifgl.graph import CrossExchangePlan


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

    def __call__(self, plan: CrossExchangePlan, y: torch.Tensor) -> torch.Tensor:
        return self.fn(plan, y)

    def add_into(self, plan: CrossExchangePlan, y: torch.Tensor, total: torch.Tensor) -> None:
        total += self.fn(plan, y)
