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
The cross sum is the only thing that needs other clients: see ``CrossExchangePlan``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from mpifgl.shards import ClientShard, Manifest, load_client_shard, shard_filename

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


def _select(csr: sp.csr_matrix, rows: np.ndarray | None, col_map: np.ndarray | None,
            num_cols: int) -> sp.csr_matrix:
    """csr[rows][:, cols] where col_map[c] = new column of c or -1 (fast, keeps CSR order)."""
    sub = csr if rows is None else csr[rows]
    if col_map is None:
        return sub
    new_cols = col_map[sub.indices]
    keep = new_cols >= 0
    kept_before = np.concatenate([[0], np.cumsum(keep)]).astype(np.int64)
    indptr = kept_before[sub.indptr]
    return sp.csr_matrix((sub.data[keep], new_cols[keep], indptr), shape=(sub.shape[0], num_cols))


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    matrix = matrix.tocsr()
    return torch.sparse_csr_tensor(torch.from_numpy(matrix.indptr.astype(np.int64)),
                                   torch.from_numpy(matrix.indices.astype(np.int64)),
                                   torch.from_numpy(matrix.data).to(dtype), size=matrix.shape)


class SparseOperator:
    """A constant sparse matrix with its transpose precomputed, for y -> M y with autograd."""

    def __init__(self, matrix: sp.csr_matrix, dtype: torch.dtype):
        self.shape = matrix.shape
        self.forward_matrix = torch_csr(matrix, dtype)
        self.transpose_matrix = torch_csr(matrix.T.tocsr(), dtype)

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(dense, self)


class _SparseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dense: torch.Tensor, op: SparseOperator) -> torch.Tensor:  # type: ignore[override]
        ctx.op = op
        if op.shape[0] == 0 or op.shape[1] == 0 or dense.shape[1] == 0:
            return dense.new_zeros((op.shape[0], dense.shape[1]))
        return op.forward_matrix @ dense

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        op = ctx.op
        if op.shape[0] == 0 or op.shape[1] == 0 or grad.shape[1] == 0:
            return grad.new_zeros((op.shape[1], grad.shape[1])), None
        return op.transpose_matrix @ grad.contiguous(), None


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
    """The cross-client sum for one sample: client i sends ``send_matrix @ y_i`` (all sampled rows
    of all clients, client-ordered, own segment zero); the server sums over clients and returns
    each client its own segment. The operator is self-adjoint as a whole, so the backward pass is
    the same exchange applied to the gradient. ``segment_rows[j]`` = |S_j|."""

    send_matrix: SparseOperator  # [n_S, |S_i|] = (A_i,cross[S_i, S])^T
    segment_rows: np.ndarray  # int64 [m]
    own_segment: int  # client id, or -1 for the server


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
    nodes (None: 1). ``exchanged``: build the cross-client plan (False in centralized mode)."""
    own = graph.client_id
    n_i = graph.num_nodes
    if samples is None:
        rows = np.arange(n_i, dtype=np.int64)
        inner = graph.inner
        cross = graph.cross if exchanged else None
        segment_rows = graph.client_sizes.copy()
    else:
        rows = samples[own] if own >= 0 else np.zeros(0, dtype=np.int64)
        inner_map = np.full(n_i, -1, dtype=np.int64)
        inner_map[rows] = np.arange(rows.shape[0])
        inner = _select(graph.inner, rows, inner_map, rows.shape[0])
        cross = None
        if exchanged:
            col_map, total = sample_columns(graph, samples)
            cross = _select(graph.cross, rows, col_map, total)
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
        plan = CrossExchangePlan(SparseOperator(cross.T.tocsr(), dtype), segment_rows, own)
    return LayerOperator(rows, SparseOperator(inner, dtype), as_col(row_scale), as_col(col_scale),
                         as_col(self_scale), plan)
