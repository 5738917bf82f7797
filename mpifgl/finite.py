"""Nothing non-finite is ever a result: a NaN or an infinity in a loss, a gradient or a
parameter, on any rank, ends the whole run at that step with one line naming where it began.

Two checks per step (``FiniteGuard``), neither of them a collective while the numbers are fine:

1. ``before_sum``: a method hands over what this rank adds to the sum over ranks (its local
   loss and gradients; FedAvg: its locally trained parameters). A finding is only remembered:
   the sum carries any NaN or infinity to every rank (IEEE sums keep them).
2. ``after_step``: every rank looks at values that are bit-identical on every rank (the global
   loss, the parameters after the optimizer step). If one is not finite, every rank knows it
   at the same point, and only then the ranks exchange what step 1 found (one small gather), so
   the line names the ranks where it began; every rank raises the same ``NonFiniteError`` and
   rank 0 prints it. Nothing more is written: no final.json, model.pt or metrics line of the
   step's epoch; the last checkpoint stays as it was.

``--secure`` masks the sum as fixed-point words, which cannot hold a NaN, so there step 1 raises
at once on the rank that found it (the job's abort rule, ``mpifgl.train.run_rank``).
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import torch

from mpifgl.communicator import Communicator
from mpifgl.failures import AgreedFailure, rank_label

MAX_RANKS_NAMED = 4  # ranks listed by name in the line; the rest are counted


class NonFiniteError(AgreedFailure):
    """A non-finite loss, gradient or parameter, agreed on by every rank (``after_step``)."""


def first_non_finite(values: np.ndarray | torch.Tensor) -> tuple[int, float] | None:
    """(flat index, value) of the first NaN or infinity, None if every value is finite. One
    reduction when all are finite: a sum of finite values is finite unless it overflows, and a
    NaN or an infinity makes the sum non-finite."""
    flat = values.detach().reshape(-1) if isinstance(values, torch.Tensor) else values.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is checked below
        total = float(flat.sum())
    if math.isfinite(total):
        return None
    bad = (~torch.isfinite(flat)).nonzero() if isinstance(flat, torch.Tensor) \
        else np.flatnonzero(~np.isfinite(flat))
    if len(bad) == 0:
        return None  # the sum overflowed; every value is finite
    index = int(bad[0])
    return index, float(flat[index])


def _segments(model: torch.nn.Module) -> Iterator[tuple[str, int, int]]:
    """(parameter name, start, end) of each parameter in a flat vector of model.parameters()."""
    start = 0
    for name, parameter in model.named_parameters():
        yield name, start, start + parameter.numel()
        start += parameter.numel()


class FiniteGuard:
    """One rank's side of the rule (module docstring)."""

    def __init__(self, comm: Communicator, sum_keeps_non_finite: bool = True):
        self.comm = comm
        # False with --secure: the masked sum refuses NaN, so a finding is raised where it is
        self.sum_keeps_non_finite = sum_keeps_non_finite
        self.finding: str | None = None  # what before_sum found since the last clean step

    def before_sum(self, loss: float, contribution: np.ndarray, model: torch.nn.Module,
                   what: str) -> None:
        """Check this rank's share of a sum over ranks: its loss and ``contribution``, a flat
        vector in model.parameters() order (``what`` names it: "local gradient",
        "parameter after local training"). No communication."""
        if self.finding is not None:
            return
        if not math.isfinite(loss):
            self.finding = f"local loss ({loss})"
        else:
            bad = first_non_finite(np.asarray(contribution))
            if bad is not None:
                index, value = bad
                name = next(n for n, start, end in _segments(model) if start <= index < end)
                self.finding = f"{what} of {name} ({value})"
        if self.finding is not None and not self.sum_keeps_non_finite:
            who = "" if self.comm.is_single_process else \
                f" on {rank_label(self.comm.rank, self.comm.client_id)}"
            raise ValueError(f"non-finite {self.finding}{who}; nothing was written for this "
                             f"step (a lower --lr may help)")

    def after_step(self, epoch: int, step: int, steps: int, loss: float,
                   model: torch.nn.Module) -> None:
        """Check the values every rank holds alike after a step; on a finding, agree on where
        it began and raise NonFiniteError on every rank (collective only then)."""
        found = None if math.isfinite(loss) else f"the loss summed over ranks is {loss}"
        if found is None:
            for name, parameter in model.named_parameters():
                bad = first_non_finite(parameter)
                if bad is not None:
                    found = f"parameter {name} is {bad[1]} after the optimizer step"
                    break
        if found is None:
            self.finding = None
            return
        origins = self.comm.agree_on_errors(self.finding)
        where = f"in epoch {epoch}, step {step} of {steps}"
        if not origins:  # finite on every rank before the sum: the sum or the step made it
            raise NonFiniteError(f"non-finite values {where}: {found} (every rank's own "
                                 "loss and gradients were finite)")
        if self.comm.is_single_process:
            raise NonFiniteError(f"non-finite {origins[0][2]} {where}")
        _, _, first = origins[0]
        labels = [rank_label(rank, client) for rank, client, _ in origins]
        others = labels[1:MAX_RANKS_NAMED]
        more = len(labels) - 1 - len(others)
        also = (f" (also on {', '.join(others)}" + (f" and {more} more" if more else "") + ")"
                if others else "")
        raise NonFiniteError(f"non-finite {first} on {labels[0]}{also} {where}")
