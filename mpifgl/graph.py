"""A client's view of the graph and the propagation operators built from it. No MPI.

Index spaces used throughout:

* local index: position of a node inside its client's shard (0..n_i-1);
* client-ordered index: offset_j + local index, clients laid end to end in client order. The
  cross-client exchange buffers are laid out in this order (restricted to the sampled nodes).

The propagation of one layer on client i, for a sample S (S_i = all nodes when not sampling):

    H_i = row_scale * (A_ii[S_i,S_i] y_i + sum_{j != i} A_ij[S_i,S_j] y_j) + self_scale * O_i

with O = Z W and y = col_scale * O (col_scale carries 1/p(u)). For GCN, row_scale = d~^{-1/2},
col_scale = d~^{-1/2} / p, self_scale = d~^{-1} (d~ = whole-graph degree + 1). For 1-GNN (PyG
GraphConv, sum aggregation) row_scale = 1, col_scale = 1 / p and the root term has its own weight.
The cross sum is the only thing that needs other clients: see ``CrossExchangePlan`` and
mpifgl.exchange.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fgl_common.shard_format import ClientShard, Manifest, load_client_shard, shard_filename

try:  # the kernel behind scipy's csr_matrix @ dense, without its per-call Python checks
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # a scipy that moved it: the public (slower) route still works
    _csr_matvecs = None

def numpy_dtype(dtype: torch.dtype) -> type:
    """The numpy float type of one of the program's torch float types (float32 or float64)."""
    return np.float64 if dtype == torch.float64 else np.float32


# torch marks sparse CSR as beta; we only use CSR @ dense, which is stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


@dataclass
class ClientGraph:
    """What one rank holds. The server holds a graph with no nodes (it opens no shard)."""

    client_id: int  # -1 for the server
    client_sizes: np.ndarray  # int64 [m], n_j of every client (from the manifest)
    global_id: np.ndarray  # int64 [n_i]
    x: np.ndarray  # float [n_i, d]
    y: np.ndarray  # int64 [n_i]
    train_mask: np.ndarray  # bool [n_i]
    val_mask: np.ndarray
    test_mask: np.ndarray
    degree: np.ndarray  # int64 [n_i], whole graph, no self loop
    inner: sp.csr_matrix  # A_ii [n_i, n_i]
    cross: sp.csr_matrix  # [n_i, n] in client-ordered columns, own columns empty

    @cached_property
    def inner_arrays(self) -> "CSRArrays":
        return CSRArrays.of(self.inner)

    @cached_property
    def cross_arrays(self) -> "CSRArrays":
        return CSRArrays.of(self.cross)

    @property
    def num_nodes(self) -> int:
        return int(self.global_id.shape[0])

    @property
    def num_clients(self) -> int:
        return int(self.client_sizes.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.client_sizes)]).astype(np.int64)

    @classmethod
    def from_shard(cls, shard: ClientShard, client_sizes: list[int]) -> "ClientGraph":
        sizes = np.asarray(client_sizes, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        i, n_i = shard.client_id, shard.num_nodes
        inner = shard.blocks.get(i, sp.csr_matrix((n_i, n_i), dtype=np.float32))
        others = [sp.csr_matrix((n_i, int(sizes[j])), dtype=np.float32) if j not in shard.blocks
                  or j == i else shard.blocks[j] for j in range(len(sizes))]
        cross = sp.hstack(others, format="csr", dtype=np.float32)
        cross.sort_indices()
        assert cross.shape == (n_i, int(offsets[-1]))
        return cls(i, sizes, shard.global_id, shard.x, shard.y, shard.train_mask, shard.val_mask,
                   shard.test_mask, shard.degree, inner.tocsr(), cross)

    @classmethod
    def for_rank(cls, shard_dir: str, manifest: Manifest, client_id: int) -> "ClientGraph":
        """Client ``client_id``'s graph read from its shard, or the server's (client_id -1).
        No checks against the manifest: mpifgl.train does those before calling the loaders."""
        if client_id < 0:
            return cls.empty(manifest.client_sizes(), manifest.num_features)
        shard = load_client_shard(f"{shard_dir}/{shard_filename(client_id)}")
        return cls.from_shard(shard, manifest.client_sizes())

    @classmethod
    def empty(cls, client_sizes: list[int], num_features: int) -> "ClientGraph":
        """The server's graph: no nodes, right widths, so it runs the same collective schedule."""
        sizes = np.asarray(client_sizes, dtype=np.int64)
        n = int(sizes.sum())
        z = np.zeros(0, dtype=np.int64)
        f = np.zeros(0, dtype=bool)
        return cls(-1, sizes, z, np.zeros((0, num_features), np.float32), z, f, f, f, z,
                   sp.csr_matrix((0, 0), dtype=np.float32), sp.csr_matrix((0, n), dtype=np.float32))

    @classmethod
    def merged(cls, shards: list[ClientShard]) -> "ClientGraph":
        """The whole graph as ONE client, nodes in client order (centralized mode)."""
        sizes = [s.num_nodes for s in shards]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        n = int(offsets[-1])
        rows = []
        for shard in shards:
            n_i = shard.num_nodes
            pieces = [shard.blocks.get(j, sp.csr_matrix((n_i, sizes[j]), dtype=np.float32))
                      for j in range(len(shards))]
            rows.append(sp.hstack(pieces, format="csr", dtype=np.float32))
        adj = sp.vstack(rows, format="csr", dtype=np.float32) if rows else sp.csr_matrix((0, 0))
        adj.sort_indices()
        cat = lambda name: np.concatenate([getattr(s, name) for s in shards])  # noqa: E731
        return cls(0, np.asarray([n], dtype=np.int64), cat("global_id"), cat("x"), cat("y"),
                   cat("train_mask"), cat("val_mask"), cat("test_mask"), cat("degree"), adj,
                   sp.csr_matrix((n, n), dtype=np.float32))


@dataclass
class CSRArrays:
    """A CSR matrix as bare index/float arrays. The sampled operators are rebuilt every step, and
    scipy's constructors (format checks, index-dtype choice) cost more than the slicing itself.
    Stored operators keep int32 indices where they fit (``compact_indices``): at ogbn-products
    size the cross blocks are most of a client's memory."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def of(cls, matrix: sp.csr_matrix) -> "CSRArrays":
        matrix = matrix.tocsr()
        return cls(matrix.indptr, matrix.indices, matrix.data, matrix.shape).compact_indices()

    def compact_indices(self) -> "CSRArrays":
        """The same matrix with int32 indptr and indices when every index fits, else int64 (the
        CSR kernel needs both of one type); arrays already of that type are not copied."""
        fits = max(self.shape[0] + 1, self.shape[1], self.indices.shape[0]) < 2 ** 31
        index = np.int32 if fits else np.int64
        return CSRArrays(np.asarray(self.indptr, index), np.asarray(self.indices, index),
                         self.data, self.shape)

    def select(self, rows: np.ndarray, col_map: np.ndarray, num_cols: int) -> "CSRArrays":
        """self[rows][:, cols] where col_map[c] = new column of c or -1 (CSR order kept)."""
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        row_bounds = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_bounds[1:])
        # positions of the selected rows' entries: starts[r] + 0..lengths[r]-1, end to end
        position = np.arange(row_bounds[-1], dtype=np.int64) + np.repeat(starts - row_bounds[:-1],
                                                                          lengths)
        new_cols = col_map[self.indices[position]]
        keep = new_cols >= 0
        kept_before = np.zeros(keep.shape[0] + 1, dtype=np.int64)
        np.cumsum(keep, out=kept_before[1:])
        return CSRArrays(kept_before[row_bounds], new_cols[keep], self.data[position[keep]],
                         (int(rows.shape[0]), int(num_cols)))

    def transpose(self) -> "CSRArrays":
        rows, cols = self.shape
        row_of = np.repeat(np.arange(rows, dtype=np.int64), np.diff(self.indptr))
        order = np.argsort(self.indices, kind="stable")  # within a column, rows stay ascending
        indptr = np.zeros(cols + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.indices, minlength=cols), out=indptr[1:])
        return CSRArrays(indptr, row_of[order], self.data[order], (cols, rows))

    def row_slice(self, first: int, last: int) -> "CSRArrays":
        """Rows first..last-1 (views of the arrays, no copy of the entries)."""
        start, stop = int(self.indptr[first]), int(self.indptr[last])
        return CSRArrays(self.indptr[first:last + 1] - start, self.indices[start:stop],
                         self.data[start:stop], (last - first, self.shape[1]))

    def with_dtype(self, dtype: torch.dtype) -> "CSRArrays":
        return CSRArrays(self.indptr, self.indices, np.asarray(self.data, dtype=numpy_dtype(dtype)),
                         self.shape).compact_indices()

    def matmul(self, dense: np.ndarray) -> np.ndarray:
        """self @ dense for a 2-D array of the data's dtype, by scipy's CSR kernel. Called on a
        fresh sampled operator six times a step, where the Python checks of scipy's csr_matrix
        constructor and @ cost more than the product (docs/training.md)."""
        dense = np.ascontiguousarray(dense, dtype=self.data.dtype)
        rows, cols = self.shape
        if _csr_matvecs is None:
            return sp.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape) @ dense
        if dense.shape[0] != cols:
            raise ValueError(f"sparse product of a {rows} x {cols} matrix with "
                             f"{dense.shape[0]} rows")
        out = np.zeros((rows, dense.shape[1]), dtype=dense.dtype)
        _csr_matvecs(rows, cols, dense.shape[1], self.indptr, self.indices, self.data,
                     dense.ravel(), out.ravel())
        return out

    def torch(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.sparse_csr_tensor(torch.from_numpy(self.indptr), torch.from_numpy(self.indices),
                                       torch.from_numpy(np.asarray(self.data)).to(dtype),
                                       size=self.shape)


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    return CSRArrays.of(matrix).torch(dtype)


class SparseOperator:
    """A constant sparse matrix with its transpose precomputed, for y -> M y with autograd.

    The products run in scipy's CSR kernel (``CSRArrays.matmul``), not torch's sparse CSR
    matmul, which is slower on sampled matrices and in some processes much slower for the same
    matrix (docs/training.md, "One step")."""

    def __init__(self, matrix: "sp.csr_matrix | CSRArrays", dtype: torch.dtype,
                 transpose: "CSRArrays | None" = None):
        arrays = matrix if isinstance(matrix, CSRArrays) else CSRArrays.of(matrix)
        self.shape = arrays.shape
        self.forward_matrix = arrays.with_dtype(dtype)
        transposed = arrays.transpose() if transpose is None else transpose
        self.transpose_matrix = transposed.with_dtype(dtype)

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(dense, self)


class _SparseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dense: torch.Tensor, op: SparseOperator) -> torch.Tensor:  # type: ignore[override]
        ctx.op = op
        if op.shape[0] == 0 or op.shape[1] == 0 or dense.shape[1] == 0:
            return dense.new_zeros((op.shape[0], dense.shape[1]))
        return torch.from_numpy(op.forward_matrix.matmul(dense.detach().numpy()))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        op = ctx.op
        if op.shape[0] == 0 or op.shape[1] == 0 or grad.shape[1] == 0:
            return grad.new_zeros((op.shape[1], grad.shape[1])), None
        return torch.from_numpy(op.transpose_matrix.matmul(grad.detach().numpy())), None


@dataclass
class LayerOperator:
    """Everything one layer's propagation needs on one client for one sample (or the full graph).

    rows: local indices of the output rows (the sample); row_scale/col_scale/self_scale: [k, 1]."""

    rows: np.ndarray
    inner: SparseOperator  # A_ii[S_i, S_i]
    row_scale: torch.Tensor
    col_scale: torch.Tensor
    self_scale: torch.Tensor
    exchange: "CrossExchangePlan | None"


@dataclass
class CrossExchangePlan:
    """The cross-client sum for one sample, as one client sees it (mpifgl.exchange runs it).
    Client i's terms for all clients are ``(A_i,cross[S_i, S])^T y_i`` [n_S, d], S-positions
    client-ordered; only the ``touched`` rows can be non-zero. The server sums over clients and
    returns each client its own segment, of which only the ``receive_rows`` can be non-zero.
    ``segment_rows[j]`` = |S_j|. ``routing``: the chunks agreed by ``CrossClientExchange.prepare``."""

    send_rows: "CSRArrays | None"  # [t_i, |S_i|]: the touched rows of the transposed cross block
    touched: np.ndarray  # int64 [t_i], ascending S-positions of those rows
    receive_rows: np.ndarray  # int64 [u_i], ascending own rows with a cross edge into S
    segment_rows: np.ndarray  # int64 [m]
    own_segment: int  # client id, or -1 for the server
    routing: Any = None  # mpifgl.exchange.Routing once prepared

    @classmethod
    def of_cross_block(cls, cross: CSRArrays, segment_rows: np.ndarray, own: int,
                       dtype: torch.dtype) -> "CrossExchangePlan":
        """From A_i,cross[S_i, S] [|S_i|, n_S]. Its transpose's empty rows are dropped (their
        entries are contiguous already, so only indptr changes)."""
        transposed = cross.transpose()
        touched = np.flatnonzero(np.diff(transposed.indptr)).astype(np.int64)
        indptr = np.concatenate([[0], transposed.indptr[touched + 1]]).astype(np.int64)
        send_rows = CSRArrays(indptr, transposed.indices, transposed.data,
                              (int(touched.shape[0]), int(cross.shape[0])))
        receive_rows = np.flatnonzero(np.diff(cross.indptr)).astype(np.int64)
        return cls(send_rows.with_dtype(dtype), touched, receive_rows, segment_rows, own)


def sample_columns(graph: ClientGraph, samples: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """Column map from client-ordered index to position in the concatenated sample S."""
    offsets = graph.offsets
    col_map = np.full(int(offsets[-1]), -1, dtype=np.int64)
    position = 0
    for j, index in enumerate(samples):
        col_map[offsets[j] + index] = position + np.arange(index.shape[0])
        position += index.shape[0]
    return col_map, position


def build_operator(graph: ClientGraph, backbone: str, samples: list[np.ndarray] | None,
                   probability: np.ndarray | None, dtype: torch.dtype,
                   exchanged: bool) -> LayerOperator:
    """Operators for the sample ``samples[j]`` (sorted local indices of every client j), or for
    the full graph when ``samples`` is None. ``probability`` = p(u) of this client's sampled
    nodes (None: 1). ``exchanged``: build the cross-client plan (False in centralized mode).
    The server (client id -1) gets only its plan's segment sizes: it holds no rows and runs no
    model, it takes part in the sums (``GNNMethod.server_exchanges``)."""
    own = graph.client_id
    n_i = graph.num_nodes
    if own < 0 and exchanged:
        segments = graph.client_sizes if samples is None else [s.shape[0] for s in samples]
        return _server_operator(np.asarray(segments, dtype=np.int64), dtype)
    if samples is None:
        rows = np.arange(n_i, dtype=np.int64)
        inner = graph.inner_arrays
        cross = graph.cross_arrays if exchanged else None
        segment_rows = graph.client_sizes.copy()
    else:
        rows = samples[own] if own >= 0 else np.zeros(0, dtype=np.int64)
        inner_map = np.full(n_i, -1, dtype=np.int64)
        inner_map[rows] = np.arange(rows.shape[0])
        inner = graph.inner_arrays.select(rows, inner_map, rows.shape[0])
        cross = None
        if exchanged:
            col_map, total = sample_columns(graph, samples)
            cross = graph.cross_arrays.select(rows, col_map, total)
        segment_rows = np.asarray([s.shape[0] for s in samples], dtype=np.int64)
    p = np.ones(rows.shape[0]) if probability is None else probability
    deg = graph.degree[rows].astype(np.float64)
    if backbone == "gcn":
        dinv = 1.0 / np.sqrt(deg + 1.0)
        row_scale, col_scale, self_scale = dinv, dinv / p, dinv * dinv
    elif backbone == "1gnn":
        row_scale, col_scale, self_scale = np.ones_like(deg), 1.0 / p, np.zeros_like(deg)
    else:
        raise ValueError(f"backbone {backbone!r}, expected gcn or 1gnn")
    as_col = lambda v: torch.from_numpy(np.asarray(v, dtype=np.float64)).to(dtype)[:, None]  # noqa: E731
    plan = None
    if cross is not None:
        plan = CrossExchangePlan.of_cross_block(cross, segment_rows, own, dtype)
    return LayerOperator(rows, SparseOperator(inner, dtype), as_col(row_scale), as_col(col_scale),
                         as_col(self_scale), plan)


def _server_operator(segment_rows: np.ndarray, dtype: torch.dtype) -> LayerOperator:
    """No rows, an empty operator, and the exchange plan's segment sizes only."""
    empty = torch.zeros((0, 1), dtype=dtype)
    no_rows = np.zeros(0, dtype=np.int64)
    inner = CSRArrays(np.zeros(1, dtype=np.int64), no_rows, np.zeros(0), (0, 0))
    return LayerOperator(no_rows, SparseOperator(inner, dtype), empty, empty, empty,
                         CrossExchangePlan(None, no_rows, no_rows, segment_rows, -1))
