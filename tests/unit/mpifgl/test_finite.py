"""mpifgl.finite: a NaN or an infinity in a loss, a gradient or a parameter ends every rank at
the same step with one message naming where it began; nothing is exchanged while all is finite."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifgl.communicator import LocalComm
from mpifgl.finite import FiniteGuard, NonFiniteError, first_non_finite
from tests.helpers.thread_comm import ThreadWorld


def model(value: float = 0.5) -> torch.nn.Module:
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(value)
    return layer


def test_first_non_finite():
    assert first_non_finite(np.ones(5)) is None
    assert first_non_finite(np.full(3, 3e38, np.float32)) is None  # the sum overflows; all finite
    found = first_non_finite(np.array([1.0, np.inf, np.nan]))
    assert found == (1, np.inf)
    index, value = first_non_finite(torch.tensor([0.0, float("nan")]))
    assert index == 1 and np.isnan(value)


def test_one_process_names_the_quantity_epoch_and_step():
    guard, layer = FiniteGuard(LocalComm()), model()
    grads = np.zeros(8, np.float32)
    guard.before_sum(0.7, grads, layer, "local gradient")
    guard.after_step(1, 1, 4, 0.7, layer)  # all finite: nothing happens
    grads[6] = np.inf  # the bias, after the 6 weights
    guard.before_sum(0.7, grads, layer, "local gradient")
    with torch.no_grad():
        layer.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"^non-finite local gradient of bias \(inf\) in "
                                             r"epoch 2, step 3 of 4$"):
        guard.after_step(2, 3, 4, 0.7, layer)


def test_values_made_non_finite_by_the_step_itself():
    guard = FiniteGuard(LocalComm())
    layer = model(3e38)
    with pytest.raises(NonFiniteError, match=r"the loss summed over ranks is inf .*own loss and "
                                             r"gradients were finite"):
        guard.after_step(5, 1, 1, float("inf"), layer)
    with torch.no_grad():
        layer.weight[1, 2] = float("-inf")
    with pytest.raises(NonFiniteError, match=r"parameter weight is -inf after the optimizer step"):
        guard.after_step(5, 1, 1, 0.1, layer)


def test_every_rank_stops_together_naming_the_ranks_where_it_began():
    def body(comm):
        guard, layer = FiniteGuard(comm), model()
        local_loss = float("nan") if comm.rank in (2, 3) else 0.5
        guard.before_sum(local_loss, np.zeros(8), layer, "local gradient")
        try:  # the sum carried the NaN to every rank: the global loss is NaN everywhere
            guard.after_step(7, 2, 4, float("nan"), layer)
        except NonFiniteError as exc:
            return str(exc)
        return None

    messages = ThreadWorld(4).run(body)
    assert len(set(messages)) == 1
    assert messages[0] == ("non-finite local loss (nan) on client 1 (rank 2) (also on client 2 "
                           "(rank 3)) in epoch 7, step 2 of 4")


def test_with_secure_sums_the_rank_that_found_it_raises_at_once():
    guard = FiniteGuard(LocalComm(), sum_keeps_non_finite=False)
    with pytest.raises(ValueError, match=r"non-finite parameter after local training of weight"):
        guard.before_sum(0.1, np.array([0, 0, np.nan, 0, 0, 0, 0, 0]), model(),
                         "parameter after local training")
