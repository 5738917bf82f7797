"""Tiny hand-made and random graphs written as shard directories, for the training tests.

Kept independent of data_prep on purpose: the trainer's tests must not pass only because the
writer and the reader share a bug. Shards follow fgl_common.shard_format's documented format.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import scipy.sparse as sp

from fgl_common.shard_format import (FORMAT_VERSION, ClientShard, file_sha256, shard_filename,
                                     write_client_shard)


@dataclass
class Graph:
    adj: sp.csr_matrix  # symmetric 0/1, no self loops, [n, n]
    x: np.ndarray  # float32 [n, d]
    y: np.ndarray  # int64 [n]
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.adj.shape[0]

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1


def random_graph(n: int = 40, avg_degree: float = 4.0, d: int = 6, classes: int = 3,
                 seed: int = 0, isolated: int = 1) -> Graph:
    """A random undirected graph with class-dependent features; the last ``isolated`` nodes
    have no edges (degree 0 is a case the normalisation must handle)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    m = int(n * avg_degree / 2)
    src, dst = rng.integers(0, n - isolated, m), rng.integers(0, n - isolated, m)
    keep = src != dst
    adj = sp.coo_matrix((np.ones(keep.sum()), (src[keep], dst[keep])), shape=(n, n)).tocsr()
    adj = ((adj + adj.T) > 0).astype(np.float32).tocsr()
    x = (rng.normal(size=(n, d)) + np.eye(classes, d)[y] * 2).astype(np.float32)
    split = rng.permutation(n)
    train, val, test = (np.zeros(n, bool) for _ in range(3))
    train[split[: n // 2]], val[split[n // 2: 3 * n // 4]], test[split[3 * n // 4:]] = True, True, True
    return Graph(adj, x, y.astype(np.int64), train, val, test)


def random_parts(n: int, num_clients: int, seed: int = 0) -> np.ndarray:
    """Client of every node, sizes as equal as possible, order shuffled."""
    return np.random.default_rng(seed).permutation(np.arange(n) % num_clients)


_WRITTEN: dict[str, Path] = {}  # content key -> this process's first copy of those shards
_WRITTEN_ROOT: list[Path] = []


def _content_key(graph: Graph, parts: np.ndarray, dataset: str) -> str:
    """Everything write_shards' output depends on (it is deterministic, byte for byte)."""
    digest = hashlib.sha256(dataset.encode())
    adj = sp.csr_matrix(graph.adj)
    arrays = (adj.indptr, adj.indices, adj.data, np.asarray(adj.shape), graph.x, graph.y,
              graph.train_mask, graph.val_mask, graph.test_mask, np.asarray(parts))
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def write_shards(graph: Graph, parts: np.ndarray, out: str | Path, dataset: str = "toy") -> Path:
    """The shard directory of ``graph`` split by ``parts``, written into ``out``. The same
    inputs give the same bytes, so a repeated call copies the files written the first time
    (plain copies: fresh files of the caller's own, which it may change at will)."""
    out = Path(out)
    key = _content_key(graph, parts, dataset)
    if key not in _WRITTEN:
        if not _WRITTEN_ROOT:
            _WRITTEN_ROOT.append(Path(tempfile.mkdtemp(prefix="test-shards-")))
            atexit.register(shutil.rmtree, _WRITTEN_ROOT[0], True)
        _WRITTEN[key] = _write_shards(graph, parts, _WRITTEN_ROOT[0] / key, dataset)
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted(_WRITTEN[key].iterdir()):
        shutil.copyfile(source, out / source.name)
    return out


def _write_shards(graph: Graph, parts: np.ndarray, out: Path, dataset: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    num_clients = int(parts.max()) + 1
    members = [np.flatnonzero(parts == i) for i in range(num_clients)]
    local = np.empty(graph.num_nodes, dtype=np.int64)
    for ids in members:
        local[ids] = np.arange(ids.shape[0])
    degree = np.asarray(graph.adj.sum(axis=1)).ravel().astype(np.int64)
    clients = []
    for i, ids in enumerate(members):
        rows = graph.adj[ids]
        blocks = {}
        for j, other in enumerate(members):
            block = rows[:, other].tocsr()
            if block.nnz:
                block.sort_indices()
                blocks[j] = block
        attrs = {"format_version": FORMAT_VERSION, "dataset": dataset, "num_clients": num_clients,
                 "client_id": i, "partition": "test", "seed": 0}
        shard = ClientShard(i, ids.astype(np.int64), graph.x[ids], graph.y[ids],
                            graph.train_mask[ids], graph.val_mask[ids], graph.test_mask[ids],
                            degree[ids], blocks, attrs)
        path = out / shard_filename(i)
        write_client_shard(path, shard)
        clients.append({"client_id": i, "file": shard_filename(i), "num_nodes": int(ids.shape[0]),
                        "sha256": file_sha256(path)})
    manifest = {"format_version": FORMAT_VERSION, "dataset": dataset, "partition": "test",
                "seed": 0, "num_clients": num_clients, "num_nodes": graph.num_nodes,
                "num_features": int(graph.x.shape[1]), "num_classes": graph.num_classes,
                "split_rule": "test", "clients": clients}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def tamper_shard(shard_dir: Path, client: int, *, source: Path | None = None,
                 x: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """Change client ``client``'s shard as a hostile tester would, keeping the manifest's
    checksum consistent: replace the file with ``source`` (a shard of another partition), or
    rewrite its features with ``x(features)``."""
    path = Path(shard_dir) / shard_filename(client)
    if source is not None:
        shutil.copy(source, path)
    if x is not None:
        with h5py.File(path, "r+") as f:
            f["nodes/x"][...] = x(f["nodes/x"][()])
    manifest_path = Path(shard_dir) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["clients"][client]["sha256"] = file_sha256(path)
    manifest_path.write_text(json.dumps(manifest, indent=2))
