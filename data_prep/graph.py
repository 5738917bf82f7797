"""The in-memory graph every loader returns, its canonical adjacency, and seeded splits.

Canonical adjacency: undirected (symmetric), no self loops, no duplicate edges, CSR with sorted
column indices, int8 ones as values and int32 indices whenever they fit (they halve the memory
of the largest array at ogbn-products scale)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

INT32_MAX = np.iinfo(np.int32).max


@dataclass
class GraphData:
    """A node-classification graph in global node order."""

    name: str
    adjacency: sp.csr_matrix  # [n, n] canonical (see module docstring)
    x: np.ndarray  # float32 [n, d]
    y: np.ndarray  # int64 [n], classes 0..num_classes-1
    train_mask: np.ndarray  # bool [n]
    val_mask: np.ndarray  # bool [n]
    test_mask: np.ndarray  # bool [n]
    num_classes: int
    split_rule: str  # e.g. "planetoid-full" or "stratified-60/20/20 seed=0"
    source: dict[str, Any] = field(default_factory=dict)  # where the data came from

    @property
    def num_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def num_edges(self) -> int:
        """Undirected edges (each stored twice in the adjacency)."""
        return int(self.adjacency.nnz // 2)

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def check(self) -> None:
        """Internal invariants every loader must establish."""
        n = self.num_nodes
        assert self.adjacency.shape == (n, n)
        assert self.x.dtype == np.float32 and self.x.ndim == 2 and self.x.shape[0] == n
        assert self.y.dtype == np.int64 and self.y.shape == (n,)
        for mask in (self.train_mask, self.val_mask, self.test_mask):
            assert mask.dtype == np.bool_ and mask.shape == (n,)
        assert n == 0 or (self.y.min() >= 0 and self.y.max() < self.num_classes)


def index_dtype(num_nodes: int, num_entries: int) -> type:
    return np.int32 if max(num_nodes, num_entries) <= INT32_MAX else np.int64


def edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """One int64 key lo * n + hi per edge with lo < hi; self loops dropped (not deduplicated)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"edge list refers to nodes outside 0..{num_nodes - 1}")
    lo = np.minimum(src, dst)
    hi = np.maximum(src, dst)
    keep = lo != hi
    return lo[keep] * np.int64(num_nodes) + hi[keep]


def adjacency_from_keys(keys: np.ndarray, num_nodes: int) -> sp.csr_matrix:
    """Symmetric CSR from sorted, unique edge keys (see ``edge_keys``).

    Rows are filled hi->lo half first, then lo->hi: scipy's COO->CSR conversion is a stable
    counting sort, so each row comes out with ascending columns and no extra sort is needed."""
    dtype = index_dtype(num_nodes, 2 * keys.shape[0])
    n64 = np.int64(num_nodes)
    lo = (keys // n64).astype(dtype)
    hi = (keys % n64).astype(dtype)
    rows = np.concatenate([hi, lo])
    cols = np.concatenate([lo, hi])
    del lo, hi
    data = np.ones(rows.shape[0], dtype=np.int8)
    adjacency = sp.coo_matrix((data, (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
    del rows, cols, data
    adjacency.has_sorted_indices = True  # established by construction (see docstring)
    return adjacency


def undirected_adjacency(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> sp.csr_matrix:
    """Canonical adjacency from any directed edge list (duplicates and self loops allowed)."""
    keys = np.unique(edge_keys(src, dst, num_nodes))
    return adjacency_from_keys(keys, num_nodes)


def stratified_split(y: np.ndarray, seed_sequence: np.random.SeedSequence,
                     fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded split with the given train/val/test fractions inside every class."""
    rng = np.random.default_rng(seed_sequence)
    n = y.shape[0]
    perm = rng.permutation(n)
    grouped = perm[np.argsort(y[perm], kind="stable")]  # by class, random order inside a class
    class_sizes = np.bincount(y, minlength=int(y.max()) + 1 if n else 0)
    class_start = np.concatenate([[0], np.cumsum(class_sizes)[:-1]])
    labels = y[grouped]
    rank = np.arange(n) - class_start[labels]
    size = class_sizes[labels]
    n_train = np.floor(size * fractions[0] + 0.5)
    n_train_val = np.floor(size * (fractions[0] + fractions[1]) + 0.5)
    train, val, test = (np.zeros(n, dtype=bool) for _ in range(3))
    train[grouped[rank < n_train]] = True
    val[grouped[(rank >= n_train) & (rank < n_train_val)]] = True
    test[grouped[rank >= n_train_val]] = True
    return train, val, test


def popularity_split(degree: np.ndarray, seed_sequence: np.random.SeedSequence,
                     fractions: tuple[float, float, float]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split by degree as ogbn-products splits by sales rank: the best connected nodes train,
    the next validate, the rest (the long tail) test; seeded random order among equal degrees."""
    n = degree.shape[0]
    perm = np.random.default_rng(seed_sequence).permutation(n)
    ranked = perm[np.argsort(-degree[perm], kind="stable")]
    n_train = int(np.floor(n * fractions[0] + 0.5))
    n_train_val = int(np.floor(n * (fractions[0] + fractions[1]) + 0.5))
    train, val, test = (np.zeros(n, dtype=bool) for _ in range(3))
    train[ranked[:n_train]] = True
    val[ranked[n_train:n_train_val]] = True
    test[ranked[n_train_val:]] = True
    return train, val, test


def seed_stream(seed: int, purpose: str) -> np.random.SeedSequence:
    """Independent, reproducible random streams per purpose (split, partition, synthetic)."""
    purposes = {"split": 1, "partition": 2, "synthetic": 3}
    return np.random.SeedSequence([int(seed), purposes[purpose]])
