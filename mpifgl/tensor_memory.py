"""What a method's tensors take, by kind: the per-client memory the paper's time-cost table counts
(features, adjacency, activations, buffers) and the parameters beside them.

A method reports ``tensor_bytes() -> dict[kind, bytes]`` with the kinds of ``KINDS``; the trainer
gathers every rank's report into final.json (``tensor_bytes_per_rank``). Held tensors are summed
with ``nbytes``; activations are what autograd keeps for the backward pass, measured while a
step's forward runs (``SavedActivations``): the bytes of the distinct storages it saves, the
peak over steps. Process RSS (``peak_rss_mb``) is the other measure: it adds the interpreter,
torch, MPI, the allocator's slack and short-lived temporaries.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import numpy as np
import scipy.sparse as sp
import torch

from mpifgl.operators import CSRArrays, SparseFeatures, SparseMatrix, SparseOperator

KINDS = ("features", "adjacency", "activations", "buffers", "parameters")


def nbytes(*things: Any) -> int:
    """Bytes of the tensors, arrays and sparse matrices in ``things``, each memory buffer once
    (an array and a tensor viewing it count once); lists, tuples and dicts are walked, None and
    other objects count 0."""
    buffers: dict[int, int] = {}
    _collect(things, buffers)
    return sum(buffers.values())


def _collect(thing: Any, buffers: dict[int, int]) -> None:
    """Every memory buffer under ``thing``: its start address -> its size (the largest seen)."""
    if isinstance(thing, torch.Tensor):
        if thing.layout == torch.strided:
            storage = thing.untyped_storage()
            _note(buffers, storage.data_ptr(), storage.nbytes())
        else:  # a sparse tensor: its index and value tensors
            _collect([thing.crow_indices(), thing.col_indices(), thing.values()]
                     if thing.layout == torch.sparse_csr else [thing._indices(), thing._values()],
                     buffers)
    elif isinstance(thing, np.ndarray):
        base = thing
        while isinstance(base.base, np.ndarray):
            base = base.base
        _note(buffers, base.__array_interface__["data"][0], base.nbytes)
    elif isinstance(thing, CSRArrays):
        _collect([thing.indptr, thing.indices, np.asarray(thing.data)], buffers)
    elif isinstance(thing, SparseMatrix):
        _collect([thing.arrays, thing._on_device], buffers)
    elif isinstance(thing, SparseOperator):
        _collect([thing.forward_matrix, thing.transpose_matrix], buffers)
    elif isinstance(thing, SparseFeatures):
        _collect(thing.matrix, buffers)
    elif sp.issparse(thing):
        csr = thing if sp.isspmatrix_csr(thing) else thing.tocsr()
        _collect([csr.indptr, csr.indices, csr.data], buffers)
    elif isinstance(thing, dict):
        _collect(list(thing.values()), buffers)
    elif isinstance(thing, (list, tuple)):
        for item in thing:
            _collect(item, buffers)


def _note(buffers: dict[int, int], address: int, size: int) -> None:
    if size:
        buffers[address] = max(size, buffers.get(address, 0))


def parameter_bytes(model: torch.nn.Module, optimizer: Any = None) -> int:
    """The model's parameters and, for ``mpifgl.optim.Adam``, its two moment tensors."""
    moments = [getattr(optimizer, name, []) for name in ("exp_avg", "exp_avg_sq")]
    return nbytes(list(model.parameters()), moments)


def held_adjacency(graph: Any) -> list[Any]:
    """The adjacency a ``mpifgl.graph.ClientGraph`` holds: its blocks (the cross block unless
    released, ``release_cross_block``) and the CSR copies and transposes it has cached so far."""
    cached = ("cross", "inner_arrays", "cross_arrays", "inner_transposed", "cross_transposed")
    return [graph.inner, [vars(graph)[name] for name in cached if name in vars(graph)]]


def tensor_report(features: Any, adjacency: Any, activations: int, buffers: Any,
                  model: torch.nn.Module, optimizer: Any = None,
                  more_buffer_bytes: int = 0) -> dict[str, int]:
    """One rank's bytes by kind (``KINDS``): what it holds of each, each buffer once within a
    kind; ``activations`` as measured (``SavedActivations.peak``); ``more_buffer_bytes``:
    buffers a method allocates per use rather than holds (counted at their largest)."""
    return {"features": nbytes(features), "adjacency": nbytes(adjacency),
            "activations": int(activations), "buffers": nbytes(buffers) + int(more_buffer_bytes),
            "parameters": parameter_bytes(model, optimizer)}


class SavedActivations:
    """The bytes autograd saves for backward inside ``measure()`` blocks: distinct storages, the
    ones of ``exclude`` (parameters, features: counted as their own kinds) left out; ``peak`` is
    the largest total of one block."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.excluded = {_storage_key(t) for t in exclude if isinstance(t, torch.Tensor)}
        self.peak = 0

    @contextmanager
    def measure(self) -> Iterator[None]:
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            key = _storage_key(tensor)
            if key not in self.excluded and tensor.layout == torch.strided:
                saved[key] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
        self.peak = max(self.peak, sum(saved.values()))


def _storage_key(tensor: torch.Tensor) -> int:
    if tensor.layout != torch.strided:  # a sparse tensor has no one storage: not counted
        return id(tensor)
    return tensor.untyped_storage().data_ptr()
