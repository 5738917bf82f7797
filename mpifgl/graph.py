"""A client's view of the graph and the propagation operators built from it. No MPI.

Index spaces used throughout:

* local index: position of a node inside its client's shard (0..n_i-1);
* client-ordered index: offset_j + local index, clients laid end to end in client order. The
  cross-client exchange buffers are laid out in this order (restricted to the sampled nodes).

The propagation of one layer on client i, for a sample S (S_i = all nodes when not sampling):

    H_i = row_scale * (A_ii[S_i,S_i] y_i + sum_{j != i} A_ij[S_i,S_j] y_j) + (the layer's terms)

with y = col_scale * M(z) (col_scale carries 1/p(u)); each backbone's layer gives its scales
(``mpifgl.model.GraphLayer.scales``): GCN row_scale = d~^{-1/2}, col_scale = d~^{-1/2} / p,
self_scale = d~^{-1} (d~ = whole-graph degree + 1). The cross sum is the only thing that needs
other clients: see ``CrossExchangePlan`` and mpifgl.exchange.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from fgl_common.arrays import offsets
from fgl_common.shard_format import ClientShard, Manifest, load_client_shard, shard_filename
from mpifgl.model import LayerOperator, layer_type
from mpifgl.operators import CSRArrays, SparseMatrix, SparseOperator


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
    # [n_i, n] in client-ordered columns, own columns empty (rebuilt on read once released)
    cross: sp.csr_matrix

    @cached_property
    def inner_arrays(self) -> "CSRArrays":
        return CSRArrays.of(self.inner)

    @cached_property
    def cross_arrays(self) -> "CSRArrays":
        return CSRArrays.of(self.cross)

    @cached_property
    def inner_transposed(self) -> "CSRArrays":
        """A_ii^T, once per run: a sampled step selects its inner block's transpose from it."""
        return self.inner_arrays.transpose()

    @cached_property
    def cross_transposed(self) -> "tuple[CSRArrays, np.ndarray]":
        """The transposed cross block without its empty rows, once per run: (CSR [t, n_i] of
        its rows, their client-ordered indices [t], ascending). Every sampled step selects its
        exchange plan from it (``CrossExchangePlan.of_sample``) instead of transposing. A
        pattern (``CSRArrays.unit``): the blocks hold 1 per edge, the scales come apart."""
        rows, touched = self.cross_arrays.transpose().without_empty_rows()
        return rows.compact_indices().as_unit(), touched

    def release_cross_block(self) -> None:
        """Keep the cross block only as its transpose (``cross_transposed``), from which every
        exchange plan is selected: a method that has built its plans from it drops the block
        itself, a copy of the same entries. Read again (another method built on this graph),
        ``cross`` is rebuilt from the transpose, the same matrix, and not kept."""
        self.cross_transposed  # noqa: B018 - built from the block before it goes
        self.__dict__.pop("cross_arrays", None)
        self.__dict__.pop("cross", None)

    def release_features(self) -> None:
        """Drop the features: a method that keeps only what it derived from them (GCN's exact
        first layer: its input aggregate with the self term) frees the shard's copy."""
        self.__dict__.pop("x", None)

    def __getattr__(self, name: str):
        # reached only for an attribute not found: ``cross`` after release_cross_block, or ``x``
        # after release_features
        if name == "x":
            raise AttributeError("this rank's features were released (release_features): its "
                                 "method keeps only the first layer's input aggregate")
        if name != "cross" or "cross_transposed" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        rows, touched = self.cross_transposed
        columns = np.zeros(int(self.client_sizes.sum()) + 1, dtype=np.int64)
        columns[touched + 1] = np.diff(rows.indptr)
        transposed = sp.csr_matrix((np.ones(rows.nnz, dtype=np.float32), rows.indices,
                                    np.cumsum(columns)), shape=(columns.shape[0] - 1,
                                                                self.num_nodes))
        return transposed.T.tocsr()  # CSC to CSR: each row's columns ascending, as loaded

    @property
    def num_nodes(self) -> int:
        return int(self.global_id.shape[0])

    @property
    def num_clients(self) -> int:
        return int(self.client_sizes.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        return offsets(self.client_sizes)

    @classmethod
    def from_shard(cls, shard: ClientShard, client_sizes: list[int]) -> "ClientGraph":
        sizes = np.asarray(client_sizes, dtype=np.int64)
        i, n_i = shard.client_id, shard.num_nodes
        inner = shard.blocks.get(i, sp.csr_matrix((n_i, n_i), dtype=np.float32))
        others = [sp.csr_matrix((n_i, int(sizes[j])), dtype=np.float32) if j not in shard.blocks
                  or j == i else shard.blocks[j] for j in range(len(sizes))]
        cross = sp.hstack(others, format="csr", dtype=np.float32)
        cross.sort_indices()
        assert cross.shape == (n_i, int(sizes.sum()))
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
        n = int(sum(sizes))
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
class CrossExchangePlan:
    """The cross-client sum for one sample, as one client sees it (``mpifgl.exchange`` runs it).
    Client i's terms for all clients are ``(A_i,cross[S_i, S])^T y_i`` [n_S, d], S-positions
    client-ordered; only the ``touched`` rows can be non-zero. The server sums over clients and
    returns each client its own segment, of which only the ``receive_rows`` can be non-zero.
    ``segment_rows[j]`` = |S_j|. ``routing``: the chunks the exchange agreed on (its ``prepare``)."""

    send_rows: "SparseMatrix | None"  # [t_i, |S_i|]: the touched rows of the transposed cross block
    touched: np.ndarray  # int64 [t_i], ascending S-positions of those rows
    receive_rows: np.ndarray  # int64 [u_i], ascending own rows with a cross edge into S
    segment_rows: np.ndarray  # int64 [m]
    own_segment: int  # client id, or -1 for the server
    routing: Any = None
    # int64 [|S_i|]: each own row's entries in the cross block at sampled nodes, its neighbours
    # on other clients inside S (the degree --subgraph-norm adds to the inner block's)
    cross_degree: np.ndarray | None = None
    # per sender (None for this client): the positions among receive_rows whose terms it sends,
    # ascending, for a plan that is not of the cross block (--secure's unmasking); None: read
    # from this client's own cross block (A_ij = A_ji^T)
    receive_senders: list[np.ndarray | None] | None = None

    @property
    def segment_start(self) -> np.ndarray:
        """int64 [m+1]: where each client's segment of S-positions starts."""
        return offsets(self.segment_rows)

    @classmethod
    def of_full_graph(cls, graph: ClientGraph, dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> "CrossExchangePlan":
        """Every node of every client: the whole transposed cross block."""
        rows, touched = graph.cross_transposed
        return cls._of_rows(rows, touched, graph.client_sizes.copy(), graph.client_id, dtype,
                            device)

    @classmethod
    def of_sample(cls, graph: ClientGraph, own_position: np.ndarray, col_map: np.ndarray,
                  segment_rows: np.ndarray, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> "CrossExchangePlan":
        """The sample S: the rows of the transposed cross block at sampled nodes of other
        clients, their entries at this client's sampled rows. ``own_position[r]``: position of
        own row r in this client's sample, or -1; ``col_map[c]``: S-position of client-ordered
        node c, or -1. The transposed cross block of the sample, rows and entries in the same
        order as transposing it afresh, without a transpose per step."""
        rows, touched = graph.cross_transposed
        position = col_map[touched]
        sampled = np.flatnonzero(position >= 0)
        selected = rows.select(sampled, own_position, int(np.count_nonzero(own_position >= 0)))
        kept, nonempty = selected.without_empty_rows()  # some keep no sampled entry
        return cls._of_rows(kept, position[sampled[nonempty]], segment_rows, graph.client_id,
                            dtype, device)

    @classmethod
    def _of_rows(cls, send_rows: CSRArrays, touched: np.ndarray, segment_rows: np.ndarray,
                 own: int, dtype: torch.dtype, device: torch.device | str
                 ) -> "CrossExchangePlan":
        """From the touched rows of the transposed cross block [t, |S_i|]; this client's rows
        with a cross edge are the columns those rows use."""
        used = np.bincount(send_rows.indices, minlength=send_rows.shape[1])
        # asarray: the full graph's touched rows are the graph's own array, not a copy
        receive_rows = np.asarray(np.flatnonzero(used), dtype=np.int64)
        return cls(SparseMatrix(send_rows, dtype, device), np.asarray(touched, dtype=np.int64),
                   receive_rows, segment_rows, own, cross_degree=np.asarray(used, np.int64))

    @classmethod
    def of_server(cls, segment_rows: np.ndarray) -> "CrossExchangePlan":
        """The server's plan: no rows of its own, the segment sizes only."""
        no_rows = np.zeros(0, dtype=np.int64)
        return cls(None, no_rows, no_rows, segment_rows, -1)


def sample_columns(graph: ClientGraph, samples: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """Column map from client-ordered index to position in the concatenated sample S."""
    starts = graph.offsets
    col_map = np.full(int(starts[-1]), -1, dtype=np.int64)
    position = 0
    for j, index in enumerate(samples):
        col_map[starts[j] + index] = position + np.arange(index.shape[0])
        position += index.shape[0]
    return col_map, position


def build_operator(graph: ClientGraph, backbone: str, samples: list[np.ndarray] | None,
                   probability: np.ndarray | None, dtype: torch.dtype, exchanged: bool,
                   device: torch.device | str = "cpu",
                   subgraph_degrees: bool = False) -> LayerOperator:
    """Operators for the sample ``samples[j]`` (sorted local indices of every client j), or for
    the full graph when ``samples`` is None, normalised by the backbone's layer
    (``GraphLayer.scales``).
    ``probability`` = p(u) of this client's sampled nodes (None: 1). ``subgraph_degrees``: the
    sample normalised as a graph of its own (``--subgraph-norm``): each sampled node's degree
    counted inside the sample, p ignored. ``exchanged``: build the
    cross-client plan (False in one process). The server (client id -1) gets only its plan's
    segment sizes: it holds no rows and runs no model, it takes part in the sums. The structure
    is built on the host; the operator's tensors and matrices live on ``device``."""
    own = graph.client_id
    n_i = graph.num_nodes
    if own < 0 and exchanged:
        segments = graph.client_sizes if samples is None else [s.shape[0] for s in samples]
        return _server_operator(np.asarray(segments, dtype=np.int64), dtype, device)
    plan = None
    if samples is None:
        rows = np.arange(n_i, dtype=np.int64)
        inner = graph.inner_arrays
        inner_transposed = graph.inner_transposed
        if exchanged:
            plan = CrossExchangePlan.of_full_graph(graph, dtype, device)
    else:
        rows = samples[own] if own >= 0 else np.zeros(0, dtype=np.int64)
        inner_map = np.full(n_i, -1, dtype=np.int64)
        inner_map[rows] = np.arange(rows.shape[0])
        inner = graph.inner_arrays.select(rows, inner_map, rows.shape[0])
        # the transpose of the selection is the selection of the transpose, in the same order
        inner_transposed = graph.inner_transposed.select(rows, inner_map, rows.shape[0])
        if exchanged:
            col_map, _ = sample_columns(graph, samples)
            segment_rows = np.asarray([s.shape[0] for s in samples], dtype=np.int64)
            plan = CrossExchangePlan.of_sample(graph, inner_map, col_map, segment_rows, dtype,
                                               device)
    p = np.ones(rows.shape[0]) if probability is None else probability
    degree = graph.degree[rows]
    if subgraph_degrees and samples is not None:  # neighbours inside S, here and on other clients
        degree = np.diff(inner.indptr) + (plan.cross_degree if plan is not None else 0)
        p = np.ones(rows.shape[0])
    scale = layer_type(backbone).scales(torch.from_numpy(degree.astype(np.float64)),
                                        torch.from_numpy(np.asarray(p, dtype=np.float64)))
    as_col = lambda v: v.to(device=device, dtype=dtype)[:, None]  # noqa: E731
    return LayerOperator(torch.from_numpy(rows).to(device),
                         SparseOperator(inner, dtype, device, inner_transposed),
                         as_col(scale.row), as_col(scale.col), as_col(scale.self), plan)


def _server_operator(segment_rows: np.ndarray, dtype: torch.dtype,
                     device: torch.device | str) -> LayerOperator:
    """No rows, an empty operator, and the exchange plan's segment sizes only."""
    empty = torch.zeros((0, 1), dtype=dtype, device=device)
    return LayerOperator(torch.zeros(0, dtype=torch.int64, device=device),
                         SparseOperator(CSRArrays.empty(), dtype, device), empty, empty, empty,
                         CrossExchangePlan.of_server(segment_rows))
