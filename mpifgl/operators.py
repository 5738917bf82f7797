"""Sparse matrices that multiply torch tensors: the one operator interface of the model, the
exchange and the baselines.

Graph structure is index bookkeeping done on the host (``CSRArrays``: indptr, indices and data as
numpy arrays), once per shard and once per sampled step; the products go through
``SparseMatrix.matmul`` (no autograd) and ``SparseOperator`` (``op @ y`` with autograd), which
take and return torch tensors on the matrix's device. Backends:

* CPU, a matrix of ``TORCH_KERNEL_MIN_ENTRIES`` or more: torch's sparse CSR product (MKL's
  where torch has it) written straight into its result, its rows shared out among torch's
  threads (``--threads``) with the same bits for any thread count; nothing is loaded beyond
  torch;
* CPU, a smaller matrix: scipy's CSR kernel on numpy views of the tensors (no copy; its call
  costs less than torch's, docs/training.md);
* CUDA: torch's sparse CSR product (cuSPARSE), the matrix copied to the device once.

Nothing outside this module multiplies with scipy or sees the numpy array of a product.

``SparseFeatures`` is the same idea for a bag-of-words input matrix: the first layer's
transform without densifying the features.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from fgl_common.arrays import offsets

try:  # the kernels behind scipy's csr_matrix @ dense and .tocsc(), without per-call checks
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
    from scipy.sparse._sparsetools import csr_tocsc as _csr_tocsc
except ImportError:  # a scipy that moved them: the public (slower) routes still work
    _csr_matvecs = _csr_tocsc = None

# From this many stored entries torch's CSR kernel is faster than scipy's; below, scipy's call
# costs less (benchmarks/bench_kernels.py, docs/hardware.md)
TORCH_KERNEL_MIN_ENTRIES = 20_000

# torch marks sparse CSR as beta; we only use CSR @ dense, which is stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def torch_csr_product(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape,
                      dense: np.ndarray) -> torch.Tensor:
    """CSR (indptr, indices, data) of ``shape`` @ a 2-D host array of the data's dtype by
    torch's kernel, as a fresh tensor. addmm with beta 0 writes the result in place: torch's
    ``csr @ dense`` computes into a second [rows, d] buffer and copies it."""
    index = np.promote_types(indptr.dtype, indices.dtype)  # the kernel takes one index type
    matrix = torch.sparse_csr_tensor(torch.from_numpy(np.asarray(indptr, index)),
                                     torch.from_numpy(np.asarray(indices, index)),
                                     torch.from_numpy(data), size=tuple(shape))
    out = torch.empty((shape[0], dense.shape[1]), dtype=matrix.dtype)
    return torch.addmm(out, matrix, torch.from_numpy(dense), beta=0, out=out)


def csr_matmul_host(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape,
                    dense: np.ndarray) -> np.ndarray:
    """CSR (indptr, indices, data) of ``shape`` @ a C-contiguous 2-D host array of the data's
    dtype -> a fresh array: torch's kernel from ``TORCH_KERNEL_MIN_ENTRIES`` entries, else
    scipy's."""
    if indices.shape[0] >= TORCH_KERNEL_MIN_ENTRIES and shape[0] and dense.shape[1]:
        return torch_csr_product(indptr, indices, data, shape, dense).numpy()
    return scipy_csr_product(indptr, indices, data, shape, dense)


def scipy_csr_product(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape,
                      dense: np.ndarray) -> np.ndarray:
    """The same product by scipy's CSR kernel, called directly (no csr_matrix per call)."""
    rows, cols = shape
    out = np.zeros((rows, dense.shape[1]), dtype=dense.dtype)
    if _csr_matvecs is None:
        out = sp.csr_matrix((data, indices, indptr), shape=shape) @ dense
    else:
        _csr_matvecs(rows, cols, dense.shape[1], indptr, indices, data, dense.ravel(),
                     out.ravel())
    return out


def numpy_dtype(dtype: torch.dtype) -> type:
    """The numpy float type of one of the program's torch float types (float32 or float64)."""
    return np.float64 if dtype == torch.float64 else np.float32


# entries a row selection gathers at once: its int64 temporaries stay a few MB at any size
SELECT_BLOCK_ENTRIES = 1 << 20
# per float type, the ones every pattern matrix's values are a view of (``unit_values``)
_UNIT_VALUES: dict[np.dtype, np.ndarray] = {}


def unit_values(count: int, dtype) -> np.ndarray:
    """``count`` ones of ``dtype``: the values of a pattern matrix (``CSRArrays.unit``), views
    of one buffer per type kept by the process (replaced by a longer one when asked for more),
    so that patterns and their selections hold no values of their own. Never written."""
    dtype = np.dtype(dtype)
    buffer = _UNIT_VALUES.get(dtype)
    if buffer is None or buffer.shape[0] < count:  # doubling: few buffers stay referenced
        size = max(count, 2 * (0 if buffer is None else buffer.shape[0]))
        buffer = _UNIT_VALUES[dtype] = np.ones(size, dtype=dtype)
    return buffer[:count]


def _row_blocks(row_bounds: np.ndarray, entries: int):
    """(first, last) ranges of consecutive rows whose entries (``row_bounds``: int64 [r+1]
    offsets) add up to at most ``entries``; a longer row gets a range of its own."""
    first, rows = 0, row_bounds.shape[0] - 1
    while first < rows:
        last = int(np.searchsorted(row_bounds, row_bounds[first] + entries, side="right")) - 1
        last = min(rows, max(first + 1, last))
        yield first, last
        first = last


@dataclass
class CSRArrays:
    """A CSR matrix as bare index/float arrays (host). The sampled operators are rebuilt every
    step, and scipy's constructors (format checks, index-dtype choice) cost more than the slicing
    itself. Stored operators keep int32 indices where they fit (``compact_indices``): at
    ogbn-products size the cross blocks are most of a client's memory. ``unit``: a pattern,
    every value 1 (``as_unit``), its values a view of ``unit_values``, and so are those of its
    selections, transposes and slices (the products are the same: x * 1 is x)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]
    unit: bool = False

    @classmethod
    def of(cls, matrix: sp.csr_matrix) -> "CSRArrays":
        matrix = matrix.tocsr()
        return cls(matrix.indptr, matrix.indices, matrix.data, matrix.shape).compact_indices()

    @classmethod
    def empty(cls, rows: int = 0, cols: int = 0) -> "CSRArrays":
        return cls(np.zeros(rows + 1, np.int64), np.zeros(0, np.int64), np.zeros(0), (rows, cols))

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def compact_indices(self) -> "CSRArrays":
        """The same matrix with int32 indptr and indices when every index fits, else int64 (the
        CSR kernel needs both of one type); arrays already of that type are not copied."""
        fits = max(self.shape[0] + 1, self.shape[1], self.indices.shape[0]) < 2 ** 31
        index = np.int32 if fits else np.int64
        return CSRArrays(np.asarray(self.indptr, index), np.asarray(self.indices, index),
                         self.data, self.shape, self.unit)

    def as_unit(self) -> "CSRArrays":
        """The same matrix as a pattern (``unit``); ValueError if a value is not 1."""
        if not np.all(self.data == 1):
            raise ValueError("a pattern matrix must hold 1 in every entry")
        return CSRArrays(self.indptr, self.indices, unit_values(self.nnz, self.data.dtype),
                         self.shape, unit=True)

    def select(self, rows: np.ndarray, col_map: np.ndarray, num_cols: int) -> "CSRArrays":
        """self[rows][:, cols] where col_map[c] = new column of c or -1 (CSR order kept), in
        blocks of rows of about SELECT_BLOCK_ENTRIES entries: the temporaries stay bounded."""
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        row_bounds = offsets(lengths)
        kept_per_row = np.zeros(rows.shape[0], dtype=np.int64)
        columns, values = [], []
        for first, last in _row_blocks(row_bounds, SELECT_BLOCK_ENTRIES):
            # positions of these rows' entries: starts[r] + 0..lengths[r]-1, end to end
            bounds = row_bounds[first:last + 1]
            position = np.arange(bounds[0], bounds[-1], dtype=np.int64) + np.repeat(
                starts[first:last] - bounds[:-1], lengths[first:last])
            new_cols = col_map[self.indices[position]]
            keep = new_cols >= 0
            kept_per_row[first:last] = np.diff(offsets(keep)[bounds - bounds[0]])
            columns.append(new_cols[keep])
            if not self.unit:
                values.append(self.data[position[keep]])
        indices = np.concatenate(columns) if columns else np.zeros(0, dtype=col_map.dtype)
        data = (unit_values(indices.shape[0], self.data.dtype) if self.unit else
                np.concatenate(values) if values else np.zeros(0, dtype=self.data.dtype))
        return CSRArrays(offsets(kept_per_row), indices, data,
                         (int(rows.shape[0]), int(num_cols)), self.unit)

    def transpose(self) -> "CSRArrays":
        """The transpose in CSR, each row's entries in ascending column order (a counting sort,
        linear in the entries)."""
        rows, cols = self.shape
        if _csr_tocsc is None:
            row_of = np.repeat(np.arange(rows, dtype=np.int64), np.diff(self.indptr))
            order = np.argsort(self.indices, kind="stable")  # within a column, rows ascending
            indptr = offsets(np.bincount(self.indices, minlength=cols))
            data = self.data if self.unit else self.data[order]
            return CSRArrays(indptr, row_of[order], data, (cols, rows), self.unit)
        index = np.promote_types(self.indptr.dtype, self.indices.dtype)
        indptr = np.empty(cols + 1, dtype=index)
        indices = np.empty(self.nnz, dtype=index)
        data = np.empty(self.nnz, dtype=self.data.dtype)
        _csr_tocsc(rows, cols, np.asarray(self.indptr, index), np.asarray(self.indices, index),
                   self.data, indptr, indices, data)
        if self.unit:  # the ones the kernel moved: the shared ones instead
            data = unit_values(self.nnz, self.data.dtype)
        return CSRArrays(indptr, indices, data, (cols, rows), self.unit)

    def without_empty_rows(self) -> "tuple[CSRArrays, np.ndarray]":
        """The rows that hold an entry, and their indices (int64, ascending); the entries are
        contiguous already, so only indptr changes."""
        kept = np.flatnonzero(np.diff(self.indptr)).astype(np.int64)
        indptr = np.concatenate([[0], self.indptr[kept + 1]]).astype(np.int64)
        return CSRArrays(indptr, self.indices, self.data,
                         (int(kept.shape[0]), self.shape[1]), self.unit), kept

    def row_slice(self, first: int, last: int) -> "CSRArrays":
        """Rows first..last-1 (views of the arrays, no copy of the entries)."""
        start, stop = int(self.indptr[first]), int(self.indptr[last])
        return CSRArrays(self.indptr[first:last + 1] - start, self.indices[start:stop],
                         self.data[start:stop], (last - first, self.shape[1]), self.unit)

    def with_dtype(self, dtype: torch.dtype) -> "CSRArrays":
        values = (unit_values(self.nnz, numpy_dtype(dtype)) if self.unit
                  else np.asarray(self.data, dtype=numpy_dtype(dtype)))
        return CSRArrays(self.indptr, self.indices, values, self.shape,
                         self.unit).compact_indices()

    def matmul_array(self, dense: np.ndarray) -> np.ndarray:
        """self @ dense for a 2-D host array of the data's dtype (the CPU backend of
        ``SparseMatrix``; ring words of ``--secure`` use their own loops)."""
        dense = np.ascontiguousarray(dense, dtype=self.data.dtype)
        rows, cols = self.shape
        if dense.shape[0] != cols:
            raise ValueError(f"sparse product of a {rows} x {cols} matrix with "
                             f"{dense.shape[0]} rows")
        return csr_matmul_host(self.indptr, self.indices, self.data, self.shape, dense)

    def torch(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.sparse_csr_tensor(torch.from_numpy(self.indptr), torch.from_numpy(self.indices),
                                       torch.from_numpy(np.asarray(self.data)).to(dtype),
                                       size=self.shape, device=device)


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    """A host scipy matrix as a torch sparse CSR tensor (the PyG baselines' ``adj_t``)."""
    return CSRArrays.of(matrix).torch(dtype)


class SparseMatrix:
    """A constant sparse matrix of one float type on one device that multiplies dense torch
    tensors of that device."""

    def __init__(self, arrays: CSRArrays, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.arrays = arrays.with_dtype(dtype)
        self.shape = arrays.shape
        self.dtype = dtype
        self.device = torch.device(device)
        # on a GPU: the matrix copied there once, and each row slice asked for (an exchange asks
        # for the same chunks in every layer and direction)
        self._on_device: torch.Tensor | None = None
        self._slices: dict[tuple[int, int], SparseMatrix] = {}

    def row_slice(self, first: int, last: int) -> "SparseMatrix":
        if (first, last) == (0, self.shape[0]):
            return self
        if self.device.type == "cpu":
            return SparseMatrix(self.arrays.row_slice(first, last), self.dtype)
        if (first, last) not in self._slices:
            self._slices[(first, last)] = SparseMatrix(self.arrays.row_slice(first, last),
                                                       self.dtype, self.device)
        return self._slices[(first, last)]

    def matmul(self, dense: torch.Tensor) -> torch.Tensor:
        """self @ dense [rows, d] (no autograd); zeros for an empty matrix or width."""
        rows, cols = self.shape
        if dense.shape[0] != cols:
            raise ValueError(f"sparse product of a {rows} x {cols} matrix with "
                             f"{dense.shape[0]} rows")
        if rows == 0 or cols == 0 or dense.shape[1] == 0 or self.arrays.nnz == 0:
            return dense.new_zeros((rows, dense.shape[1]))
        if self.device.type == "cpu":
            return torch.from_numpy(self.arrays.matmul_array(dense.detach().numpy()))
        if self._on_device is None:
            self._on_device = self.arrays.torch(self.dtype, self.device)
        return torch.sparse.mm(self._on_device, dense.detach().contiguous())


class SparseOperator:
    """A constant sparse matrix with its transpose precomputed, for y -> M y with autograd."""

    def __init__(self, matrix: "sp.csr_matrix | CSRArrays", dtype: torch.dtype,
                 device: torch.device | str = "cpu", transpose: CSRArrays | None = None):
        """``transpose``: the matrix's transpose where the caller has it already (each row's
        entries in ascending column order, as ``CSRArrays.transpose`` gives)."""
        arrays = matrix if isinstance(matrix, CSRArrays) else CSRArrays.of(matrix)
        self.shape = arrays.shape
        self.forward_matrix = SparseMatrix(arrays, dtype, device)
        self.transpose_matrix = SparseMatrix(
            arrays.transpose() if transpose is None else transpose, dtype, device)

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(dense, self)


class _SparseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dense: torch.Tensor, op: SparseOperator) -> torch.Tensor:  # type: ignore[override]
        ctx.op = op
        return op.forward_matrix.matmul(dense)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return ctx.op.transpose_matrix.matmul(grad), None


class SparseFeatures:
    """Rows of a sparse (bag-of-words) input matrix. The first layer multiplies it without ever
    densifying: on Cora or Coauthor CS (docs/algorithms.md) that is most of an epoch's FLOPs.
    Products are accumulated in float64 and rounded once to ``dtype``: as accurate as a dense
    BLAS product, so float32 runs agree with other implementations to float32 precision."""

    def __init__(self, matrix: sp.csr_matrix, dtype: torch.dtype):
        self.matrix = matrix.tocsr().astype(np.float64)
        self.dtype = dtype
        self._transpose: CSRArrays | None = None  # X^T as CSR, for the backward product

    @classmethod
    def of_dense(cls, x: torch.Tensor) -> "SparseFeatures":
        return cls(sp.csr_matrix(x.numpy()), x.dtype)

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape

    def rows(self, index: torch.Tensor) -> "SparseFeatures":
        return SparseFeatures(self.matrix[index.numpy()], self.dtype)

    def dropout(self, p: float, draws: torch.Tensor) -> "SparseFeatures":
        """Dropout on the stored entries (dropping a zero changes nothing); ``draws``: one
        uniform draw per stored entry."""
        keep = (draws >= p).numpy()
        data = self.matrix.data * keep / (1.0 - p)
        return SparseFeatures(sp.csr_matrix((data, self.matrix.indices, self.matrix.indptr),
                                            shape=self.matrix.shape), self.dtype)

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)

    def dense(self) -> torch.Tensor:
        """The rows as a dense tensor of the features' dtype."""
        return torch.from_numpy(self.matrix.toarray()).to(self.dtype)

    def linear(self, weight: torch.Tensor) -> torch.Tensor:
        """X W^T with autograd for W."""
        return _SparseInputLinear.apply(weight, self)

    def product(self, dense: np.ndarray) -> np.ndarray:
        """X @ dense (float64 host arrays)."""
        m = self.matrix
        return csr_matmul_host(m.indptr, m.indices, m.data, m.shape, np.ascontiguousarray(dense))

    def transpose_product(self, dense: np.ndarray) -> np.ndarray:
        """X^T @ dense (float64 host arrays): each output row summed over X's rows in order
        (scipy's CSC product of X.T on one thread; X^T as CSR, built once, on several)."""
        if torch.get_num_threads() == 1:
            return np.ascontiguousarray(self.matrix.T @ dense)
        if self._transpose is None:
            arrays = CSRArrays(self.matrix.indptr, self.matrix.indices, self.matrix.data,
                               self.matrix.shape)
            self._transpose = arrays.transpose().compact_indices()
        t = self._transpose
        return csr_matmul_host(t.indptr, t.indices, t.data, t.shape, np.ascontiguousarray(dense))


class _SparseInputLinear(torch.autograd.Function):
    """X W^T for a constant sparse X; backward gives dW = (X^T G)^T."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, features: SparseFeatures):  # type: ignore[override]
        ctx.features = features
        product = features.product(weight.detach().numpy().astype(np.float64).T)
        return torch.from_numpy(product).to(weight.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad_weight = ctx.features.transpose_product(grad.contiguous().numpy().astype(np.float64))
        return torch.from_numpy(np.ascontiguousarray(grad_weight.T)).to(grad.dtype), None
