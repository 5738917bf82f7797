"""mpifgl.tensor_memory: bytes by kind, each buffer once, and what autograd saves."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from mpifgl.operators import CSRArrays, SparseOperator
from mpifgl.tensor_memory import KINDS, SavedActivations, nbytes, tensor_report


def test_each_buffer_counts_once():
    array = np.zeros((10, 4), np.float32)  # 160 bytes
    view = torch.from_numpy(array)  # the same memory
    assert nbytes(array, view, array[2:5], [view[1]], {"again": array}) == 160
    assert nbytes(torch.zeros(3, dtype=torch.float64), None, "text") == 24
    matrix = sp.random(5, 6, density=0.5, format="csr", dtype=np.float32, random_state=0)
    csr = matrix.indptr.nbytes + matrix.indices.nbytes + matrix.data.nbytes
    assert nbytes(matrix) == csr
    operator = SparseOperator(CSRArrays.of(matrix), torch.float64)
    forward = operator.forward_matrix.arrays
    assert nbytes(operator) >= nbytes(forward) == (forward.indptr.nbytes + forward.indices.nbytes
                                                   + forward.data.nbytes)


def test_saved_activations_count_what_backward_keeps_without_the_excluded():
    weight = torch.ones((4, 3), dtype=torch.float64, requires_grad=True)
    x = torch.ones((5, 4), dtype=torch.float64)
    meter = SavedActivations([weight, x])
    with meter.measure():
        hidden = torch.relu(x @ weight)  # saves x and weight (excluded) and relu's output
        loss = (hidden * hidden).sum()  # saves hidden (the same storage as relu's output)
    assert meter.peak == 5 * 3 * 8
    loss.backward()
    with meter.measure():
        (x @ weight).sum()
    assert meter.peak == 5 * 3 * 8  # the peak over blocks


def test_a_report_has_every_kind():
    model = torch.nn.Linear(3, 2)
    report = tensor_report(torch.zeros(4), None, 7, torch.zeros(2), model,
                           more_buffer_bytes=5)
    assert list(report) == list(KINDS)
    assert report == {"features": 16, "adjacency": 0, "activations": 7, "buffers": 13,
                      "parameters": (6 + 2) * 4}
