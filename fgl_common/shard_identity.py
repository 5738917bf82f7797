"""Shards are who they say they are.

* ``fingerprint``: one short hash of a shard directory's manifest, which lists every shard
  file's sha256, with the partition's identity (dataset, method, seed, sizes). Training records
  it in config.json, final.json and every checkpoint, and ``--resume`` refuses other shards.
* ``graph_fingerprint``: the graph a partition was made of (dataset, sizes, split; a synthetic
  graph's generator parameters), whatever the partition: the logits of two runs on any
  partitions of one graph are comparable node for node (global node order is the graph's).
* ``partition_evidence`` / ``partition_problems``: whether the clients' shards form ONE
  partition of ONE graph: the global node ids of all clients are disjoint and cover 0..n-1, and
  every cross block agrees with its partner (A_ij = A_ji^T; A_ii symmetric). Each rank adds up
  hashes of what it holds (its ids; each edge keyed by the client pair and the two local
  indices, written the same way from both ends); the vectors are summed over ranks (one sum at
  set-up, masked with ``--secure``) and the totals compared. A client file of another
  partition or dataset changes its id set and its blocks, so the sums differ wherever it
  touches. Two hash sums of 20 bits each per quantity: a difference goes unseen with
  probability about 2^-40.

Plain numpy: no torch, no MPI.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Iterator

import numpy as np
import scipy.sparse as sp

FINGERPRINT_CHARS = 16  # hex digits shown and stored: 64 bits
IDENTITY_KEYS = ("format_version", "dataset", "partition", "partition_params", "seed",
                 "num_clients", "num_nodes", "num_features", "num_classes")
# what the graph is, apart from its partition: the split rule names its seed where the split is
# drawn (an official split has none), a synthetic graph's parameters are in the request
GRAPH_KEYS = ("dataset", "num_nodes", "num_edges", "num_features", "num_classes", "split_rule")
ID_SALT = np.uint64(0x6A09E667F3BCC908)  # keeps node-id hashes apart from edge hashes
ID_WORDS = 4  # count, outside 0..n-1, two hash sums
PART_BITS = 20  # each hash sum adds 20-bit parts: exact in a float64 bincount
CHUNK = 1 << 22  # nodes hashed at once for the expected sums
ENTRY_BLOCK = 1 << 20  # matrix entries hashed at once: about 20 int64 temporaries of this length


def fingerprint(manifest: dict[str, Any]) -> str:
    """The identity of a shard directory: its partition's description and every shard file's
    sha256, hashed (``manifest`` as read from manifest.json)."""
    record = {key: manifest.get(key) for key in IDENTITY_KEYS}
    record["sha256"] = [client.get("sha256") for client in manifest.get("clients", [])]
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def describe(manifest: dict[str, Any]) -> str:
    """``cora, random partition seed 0, 8 clients, 2708 nodes``."""
    return (f"{manifest.get('dataset')}, {manifest.get('partition')} partition seed "
            f"{manifest.get('seed')}, {manifest.get('num_clients')} clients, "
            f"{manifest.get('num_nodes')} nodes")


def graph_fingerprint(manifest: dict[str, Any]) -> str:
    """The identity of the graph a shard directory partitions (``GRAPH_KEYS``, and a synthetic
    graph's generator parameters), the same for every partition of it."""
    record = {key: manifest.get(key) for key in GRAPH_KEYS}
    record["synthetic"] = (manifest.get("request") or {}).get("synthetic")
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def describe_graph(manifest: dict[str, Any]) -> str:
    """``cora, 2708 nodes, 7 classes, split planetoid-full``."""
    return (f"{manifest.get('dataset')}, {manifest.get('num_nodes')} nodes, "
            f"{manifest.get('num_classes')} classes, split {manifest.get('split_rule')}")


# -- one partition of one graph -----------------------------------------------------------------
def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _parts(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 20-bit parts of each 64-bit hash, as float64 for bincount."""
    mask = np.uint64((1 << PART_BITS) - 1)
    return ((hashes >> np.uint64(44)) & mask).astype(np.float64), \
        ((hashes >> np.uint64(8)) & mask).astype(np.float64)


def _pair_count(num_clients: int) -> int:
    return num_clients * (num_clients + 1) // 2


def evidence_length(num_clients: int) -> int:
    return ID_WORDS + 6 * _pair_count(num_clients)


def _pair_slot(lo: np.ndarray, hi: np.ndarray, num_clients: int) -> np.ndarray:
    """Index of the client pair (lo <= hi) in the upper triangle, row by row."""
    return lo * (2 * num_clients - lo + 1) // 2 + (hi - lo)


def _edge_sums(slot: np.ndarray, row: np.ndarray, col: np.ndarray, pairs: int) -> np.ndarray:
    """[count, hash sum a, hash sum b] per pair slot of the entries (slot, row in the pair's
    lower client, column in its higher client) -> int64 [3, pairs]."""
    with np.errstate(over="ignore"):
        hashes = _mix(_mix(_mix(slot.astype(np.uint64)) ^ row.astype(np.uint64))
                      ^ col.astype(np.uint64))
    part_a, part_b = _parts(hashes)
    return np.stack([np.bincount(slot, minlength=pairs),
                     np.rint(np.bincount(slot, part_a, minlength=pairs)),
                     np.rint(np.bincount(slot, part_b, minlength=pairs))]).astype(np.int64)


def _entry_blocks(matrix) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(row, column) int64 arrays of a matrix's stored entries, in blocks of whole rows of about
    ENTRY_BLOCK entries."""
    csr = sp.csr_matrix(matrix)
    indptr = csr.indptr.astype(np.int64)
    start = 0
    while start < csr.shape[0]:
        # the last row whose entries end within ENTRY_BLOCK of this block's first entry
        stop = max(start + 1, int(np.searchsorted(indptr, indptr[start] + ENTRY_BLOCK,
                                                  side="right")) - 1)
        lengths = np.diff(indptr[start:stop + 1])
        rows = np.repeat(np.arange(start, stop, dtype=np.int64), lengths)
        yield rows, csr.indices[indptr[start]:indptr[stop]].astype(np.int64)
        start = stop


def partition_evidence(client_id: int, client_sizes: np.ndarray, global_id: np.ndarray,
                       inner: sp.spmatrix, cross: sp.spmatrix) -> np.ndarray:
    """What one rank holds, as sums to add over ranks -> int64 [evidence_length(m)].

    ``client_id`` -1: the server, which holds nothing (zeros). Otherwise a rank holding the
    nodes of client ``client_id`` (local order): ``inner`` = A_ii [n_i, n_i] in local
    columns, ``cross`` = [n_i, n] in client-ordered columns (offset_j + local index in j). A
    world of one process passes the whole graph as client 0 with ``client_sizes`` [n]."""
    sizes = np.asarray(client_sizes, dtype=np.int64)
    m = sizes.shape[0]
    pairs = _pair_count(m)
    out = np.zeros(evidence_length(m), dtype=np.int64)
    if client_id < 0:
        return out
    n = int(sizes.sum())
    ids = np.asarray(global_id, dtype=np.int64)
    with np.errstate(over="ignore"):
        part_a, part_b = _parts(_mix(ids.astype(np.uint64) ^ ID_SALT))
    out[:ID_WORDS] = [ids.shape[0], int(((ids < 0) | (ids >= n)).sum()),
                      int(part_a.sum()), int(part_b.sum())]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    forward = np.zeros((3, pairs), dtype=np.int64)
    backward = np.zeros((3, pairs), dtype=np.int64)
    # inner in local columns, cross in client-ordered ones; in blocks of rows, so the hashing's
    # temporaries stay bounded whatever the graph size (docs/hardware.md, peak memory)
    for block, column_offset in ((inner, offsets[client_id]), (cross, 0)):
        for local_rows, columns in _entry_blocks(block):
            # every entry in client-ordered coordinates: row R of client i, column C of client j
            rows = local_rows + offsets[client_id]
            cols = columns + column_offset
            owner_row = np.searchsorted(offsets, rows, side="right") - 1
            owner_col = np.searchsorted(offsets, cols, side="right") - 1
            local_row, local_col = rows - offsets[owner_row], cols - offsets[owner_col]
            # A_ij's entry (r, c) and A_ji's entry (c, r) are one edge: keyed (i, j, r, c) for
            # i <= j from the lower client's side (forward) and from the higher client's side
            # (backward); an inner block's entry counts on both sides, so A_ii must equal its
            # transpose
            low = owner_row <= owner_col
            slot = _pair_slot(np.minimum(owner_row, owner_col), np.maximum(owner_row, owner_col),
                              m)
            forward += _edge_sums(slot[low], local_row[low], local_col[low], pairs)
            high = owner_row >= owner_col
            backward += _edge_sums(slot[high], local_col[high], local_row[high], pairs)
    out[ID_WORDS:] = np.concatenate([forward.reshape(-1), backward.reshape(-1)])
    return out


def expected_id_sums(num_nodes: int) -> tuple[int, int]:
    """The two id hash sums of a partition that covers 0..n-1 exactly once."""
    total_a = total_b = 0
    for start in range(0, num_nodes, CHUNK):
        with np.errstate(over="ignore"):
            part_a, part_b = _parts(_mix(np.arange(start, min(num_nodes, start + CHUNK),
                                                   dtype=np.uint64) ^ ID_SALT))
        total_a += int(part_a.sum())
        total_b += int(part_b.sum())
    return total_a, total_b


def partition_problems(total: np.ndarray, client_sizes: np.ndarray,
                       file_of: Callable[[int], str]) -> list[str]:
    """What the summed evidence of every rank says is wrong (empty: one partition of one
    graph). ``file_of(i)`` names client i's shard file in the messages."""
    sizes = np.asarray(client_sizes, dtype=np.int64)
    m, n = sizes.shape[0], int(sizes.sum())
    problems = []
    count, outside, sum_a, sum_b = (int(v) for v in total[:ID_WORDS])
    if count != n or outside or (sum_a, sum_b) != expected_id_sums(n):
        detail = f"{outside} of them outside 0..{n - 1}" if outside else \
            "some appear twice and others not at all"
        problems.append(f"the clients' global node ids do not cover 0..{n - 1} exactly once "
                        f"({count} ids, {detail})")
    pairs = _pair_count(m)
    forward, backward = total[ID_WORDS:].reshape(2, 3, pairs)
    culprits = []
    for lo in range(m):
        for hi in range(lo, m):
            slot = int(_pair_slot(np.int64(lo), np.int64(hi), m))
            if np.array_equal(forward[:, slot], backward[:, slot]):
                continue
            culprits.append({lo, hi})
            if lo == hi:
                problems.append(f"A_{lo},{lo} in {file_of(lo)} is not symmetric")
            else:
                problems.append(f"A_{lo},{hi} in {file_of(lo)} ({forward[0, slot]} entries) "
                                f"is not the transpose of A_{hi},{lo} in {file_of(hi)} "
                                f"({backward[0, slot]} entries)")
    common = set.intersection(*culprits) if len(culprits) > 1 else set()
    if len(common) == 1:
        suspect = common.pop()
        problems.append(f"{file_of(suspect)} disagrees with every shard it shares edges with: "
                        f"it is likely from another partition or dataset")
    return problems
