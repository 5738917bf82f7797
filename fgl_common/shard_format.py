"""The shard format: the interface between data_prep (writer) and mpifgl.train (reader).

A shard directory holds ``manifest.json`` and one ``client_{i}.h5`` per client i = 0..M-1
(client i is served by MPI rank i + 1). Each shard holds, in the client's local node order:

    /nodes/global_id   int64   [n_i]      position of the node in the original graph
    /nodes/x           float32 [n_i, d]
    /nodes/y           int64   [n_i]
    /nodes/train_mask, /nodes/val_mask, /nodes/test_mask   bool [n_i]
    /nodes/degree      int64   [n_i]      degree in the WHOLE graph, self loop not counted
    /adj/{j}/indptr    int64   [n_i + 1]  CSR of the block A_ij: rows = this client's nodes,
    /adj/{j}/indices   int64   [nnz]      columns = local indices inside client j
                                          (present for every j, i included, with >= 1 edge)

File attributes: format_version, dataset, num_clients, client_id, partition, seed; each
``/adj/{j}`` group carries ``shape`` = (n_i, n_j).

This module is plain numpy/h5py/scipy: no torch, no MPI.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.sparse as sp

from fgl_common.diskspace import write_bytes

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
NODE_FIELDS = ("global_id", "x", "y", "train_mask", "val_mask", "test_mask", "degree")


class ShardError(ValueError):
    """A shard directory or file does not match the format or its manifest."""


def shard_filename(client_id: int) -> str:
    return f"client_{client_id}.h5"


def default_shard_dir(dataset: str, num_clients: int, partition: str = "random",
                      seed: int = 0) -> Path:
    """The one default shard directory, relative to the working directory:
    ``shards/<dataset>-<partition>-m<M>-s<seed>``. Used by mpifgl.train (default run),
    data_prep.api.prepare_shards and, through jobs/common.sh, jobs/data_prep.sbatch (which runs
    from the repository root)."""
    name = dataset.strip().lower().replace("_", "-")
    return Path("shards") / f"{name}-{partition}-m{int(num_clients)}-s{int(seed)}"


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class ClientShard:
    """One client's data in local order. ``blocks[j]`` is A_ij as CSR of shape (n_i, n_j)."""

    client_id: int
    global_id: np.ndarray  # int64 [n_i]
    x: np.ndarray  # float32 [n_i, d]
    y: np.ndarray  # int64 [n_i]
    train_mask: np.ndarray  # bool [n_i]
    val_mask: np.ndarray  # bool [n_i]
    test_mask: np.ndarray  # bool [n_i]
    degree: np.ndarray  # int64 [n_i], whole-graph degree without self loop
    blocks: dict[int, sp.csr_matrix] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.global_id.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])


@dataclass
class Manifest:
    """``manifest.json``, parsed. ``clients[i]`` is a dict with at least num_nodes, sha256, file."""

    raw: dict[str, Any]

    @property
    def num_clients(self) -> int:
        return int(self.raw["num_clients"])

    @property
    def num_nodes(self) -> int:
        return int(self.raw["num_nodes"])

    @property
    def num_features(self) -> int:
        return int(self.raw["num_features"])

    @property
    def num_classes(self) -> int:
        return int(self.raw["num_classes"])

    @property
    def dataset(self) -> str:
        return str(self.raw["dataset"])

    @property
    def clients(self) -> list[dict[str, Any]]:
        return list(self.raw["clients"])

    def client_sizes(self) -> list[int]:
        return [int(c["num_nodes"]) for c in self.clients]


MANIFEST_REQUIRED = ("format_version", "dataset", "partition", "seed", "num_clients",
                     "num_nodes", "num_features", "num_classes", "clients")
CLIENT_REQUIRED = ("client_id", "file", "num_nodes", "sha256")


def read_manifest(shard_dir: str | os.PathLike) -> Manifest:
    """Parse and sanity-check ``manifest.json``; raise ShardError naming the problem."""
    path = Path(shard_dir) / MANIFEST_NAME
    if not Path(shard_dir).is_dir():
        raise ShardError(f"shard directory {shard_dir} does not exist (expected the --out of "
                         f"`python -m data_prep`)")
    if not path.is_file():
        raise ShardError(f"{path}: manifest missing (expected a shard directory written by "
                         f"`python -m data_prep`)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ShardError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    missing = [k for k in MANIFEST_REQUIRED if k not in raw]
    if missing:
        raise ShardError(f"{path}: missing keys {missing}")
    if raw["format_version"] != FORMAT_VERSION:
        raise ShardError(f"{path}: format_version {raw['format_version']!r}, this program "
                         f"reads version {FORMAT_VERSION}; re-run data_prep")
    clients = raw["clients"]
    if not isinstance(clients, list) or len(clients) != raw["num_clients"]:
        raise ShardError(f"{path}: num_clients is {raw['num_clients']} but 'clients' lists "
                         f"{len(clients) if isinstance(clients, list) else clients!r}")
    for i, client in enumerate(clients):
        missing = [k for k in CLIENT_REQUIRED if k not in client]
        if missing:
            raise ShardError(f"{path}: clients[{i}] is missing keys {missing}")
        if client["client_id"] != i or client["file"] != shard_filename(i):
            raise ShardError(f"{path}: clients[{i}] names client_id={client['client_id']!r} "
                             f"file={client['file']!r}, expected {i} and {shard_filename(i)}")
    total = sum(int(c["num_nodes"]) for c in clients)
    if total != raw["num_nodes"]:
        raise ShardError(f"{path}: clients' num_nodes add up to {total}, manifest num_nodes "
                         f"is {raw['num_nodes']}")
    for i, client in enumerate(clients):  # the histogram data_prep wrote has one bin per class
        counts = client.get("class_counts")
        if isinstance(counts, list) and len(counts) != raw["num_classes"]:
            raise ShardError(f"{path}: num_classes is {raw['num_classes']!r} but clients[{i}]"
                             f".class_counts lists {len(counts)} classes; the manifest was "
                             f"edited or is damaged: re-make the shards with data_prep")
    for split in ("num_train", "num_val", "num_test"):
        if split in raw and all(split in c for c in clients):
            total = sum(int(c[split]) for c in clients)
            if total != raw[split]:
                raise ShardError(f"{path}: clients' {split} add up to {total}, manifest "
                                 f"{split} is {raw[split]}")
    return Manifest(raw)


NON_FINITE_CHUNK_ROWS = 1 << 16  # rows checked at once: bounded temporary memory


def non_finite_rows(x: np.ndarray) -> tuple[int, int, float, int] | None:
    """(first row, its first column, the value, rows affected) of the NaN or infinite entries
    of a feature matrix [n, d]; None when every entry is finite."""
    first, count = None, 0
    for start in range(0, x.shape[0], NON_FINITE_CHUNK_ROWS):
        block = np.asarray(x[start:start + NON_FINITE_CHUNK_ROWS])
        with np.errstate(over="ignore", invalid="ignore"):
            sums = block.sum(axis=1, dtype=np.float64)  # finite sums: every entry finite
        suspects = np.flatnonzero(~np.isfinite(sums))
        if not suspects.size:
            continue
        bad_rows = suspects[~np.isfinite(block[suspects]).all(axis=1)]
        count += bad_rows.size
        if first is None and bad_rows.size:
            row = int(bad_rows[0])
            column = int(np.flatnonzero(~np.isfinite(block[row]))[0])
            first = (start + row, column, float(block[row, column]))
    return None if first is None else (*first, count)


def describe_non_finite(found: tuple[int, int, float, int], row_name: str = "row",
                        global_id: np.ndarray | None = None) -> str:
    """``nan at row 17 (global id 311), column 3; 2 rows affected`` for ``non_finite_rows``'s
    answer; ``global_id`` names the first row's node in the whole graph."""
    row, column, value, count = found
    node = f" (global id {int(global_id[row])})" if global_id is not None else ""
    return (f"{value} at {row_name} {row}{node}, column {column}; {count} "
            f"{row_name}{'s' if count != 1 else ''} affected")


def write_client_shard(path: str | os.PathLike, shard: ClientShard) -> None:
    """Write one shard. Callers write into a temporary directory and rename (see data_prep).

    The HDF5 file is built in memory (HDF5's core driver: the same bytes as a file written in
    place) and then written in one piece, so a full disk is one OSError naming the file and
    the bytes needed; HDF5 writing into a full file system fails in its deallocators instead,
    which can end the process."""
    with h5py.File(f"{path}.image", "w", driver="core", backing_store=False) as f:
        _fill_shard(f, shard)
        f.flush()
        image = f.id.get_file_image()
    write_bytes(path, image)


def _fill_shard(f: h5py.File, shard: ClientShard) -> None:
    for key, value in shard.attrs.items():
        f.attrs[key] = value
    nodes = f.create_group("nodes")
    nodes.create_dataset("global_id", data=np.asarray(shard.global_id, dtype=np.int64))
    # Chunked rows so a reader can stream features; no compression: reads stay fast.
    x = np.asarray(shard.x, dtype=np.float32)
    chunk_rows = max(1, min(x.shape[0], (1 << 20) // max(1, 4 * x.shape[1])))
    nodes.create_dataset("x", data=x, chunks=(chunk_rows, x.shape[1]) if x.size else None)
    nodes.create_dataset("y", data=np.asarray(shard.y, dtype=np.int64))
    for name in ("train_mask", "val_mask", "test_mask"):
        nodes.create_dataset(name, data=np.asarray(getattr(shard, name), dtype=bool))
    nodes.create_dataset("degree", data=np.asarray(shard.degree, dtype=np.int64))
    adj = f.create_group("adj")
    for j in sorted(shard.blocks):
        block = shard.blocks[j].tocsr()
        group = adj.create_group(str(j))
        group.attrs["shape"] = np.asarray(block.shape, dtype=np.int64)
        group.create_dataset("indptr", data=block.indptr.astype(np.int64))
        group.create_dataset("indices", data=block.indices.astype(np.int64))


def _read_dataset(f: h5py.File, name: str, path: Path) -> np.ndarray:
    if name not in f:
        raise ShardError(f"{path}: dataset /{name} missing")
    try:
        return f[name][()]
    except (OSError, KeyError, RuntimeError) as exc:
        raise ShardError(f"{path}: dataset /{name} unreadable ({exc})") from None


def load_client_shard(path: str | os.PathLike, load_features: bool = True) -> ClientShard:
    """Read one shard into memory, checking shapes and dtypes (not the manifest: see
    ``check_shard_against_manifest``). Raises ShardError naming the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"{path}: shard file missing")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ShardError(f"{path}: not a readable HDF5 file ({exc}); truncated or corrupted?") \
            from None
    with f:
        attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        arrays = {}
        for name in NODE_FIELDS:
            if name == "x" and not load_features:
                ds = f.get("nodes/x")
                if ds is None:
                    raise ShardError(f"{path}: dataset /nodes/x missing")
                arrays[name] = np.empty((ds.shape[0], ds.shape[1]), dtype=np.float32)[:0]
                arrays["_x_shape"] = ds.shape
                continue
            arrays[name] = _read_dataset(f, f"nodes/{name}", path)
        n_i = arrays["global_id"].shape[0]
        x_shape = arrays.pop("_x_shape", arrays["x"].shape)
        expected = {"global_id": (n_i,), "y": (n_i,), "train_mask": (n_i,), "val_mask": (n_i,),
                    "test_mask": (n_i,), "degree": (n_i,)}
        for name, shape in expected.items():
            if arrays[name].shape != shape:
                raise ShardError(f"{path}: /nodes/{name} has shape {arrays[name].shape}, "
                                 f"expected {shape} (n_i = {n_i} from /nodes/global_id)")
        if len(x_shape) != 2 or x_shape[0] != n_i:
            raise ShardError(f"{path}: /nodes/x has shape {tuple(x_shape)}, expected ({n_i}, d)")
        blocks: dict[int, sp.csr_matrix] = {}
        adj = f.get("adj")
        if adj is None:
            raise ShardError(f"{path}: group /adj missing")
        for key in adj:
            try:
                j = int(key)
            except ValueError:
                raise ShardError(f"{path}: /adj/{key} is not a client index") from None
            group = adj[key]
            indptr = _read_dataset(f, f"adj/{key}/indptr", path)
            indices = _read_dataset(f, f"adj/{key}/indices", path)
            shape = tuple(int(s) for s in group.attrs.get("shape", (n_i, -1)))
            if shape[0] != n_i or indptr.shape != (n_i + 1,) or shape[1] < 0:
                raise ShardError(f"{path}: /adj/{j} has shape attr {shape} and indptr of "
                                 f"length {indptr.shape[0]}, expected ({n_i}, n_{j}) and {n_i + 1}")
            if indptr[0] != 0 or indptr[-1] != indices.shape[0] or np.any(np.diff(indptr) < 0):
                raise ShardError(f"{path}: /adj/{j}/indptr is not a valid CSR row pointer for "
                                 f"{indices.shape[0]} column indices")
            if indices.size and (indices.min() < 0 or indices.max() >= shape[1]):
                raise ShardError(f"{path}: /adj/{j}/indices out of range [0, {shape[1]})")
            data = np.ones(indices.shape[0], dtype=np.float32)
            blocks[j] = sp.csr_matrix((data, indices, indptr), shape=shape)
    return ClientShard(client_id=int(attrs.get("client_id", -1)), blocks=blocks, attrs=attrs,
                       **{k: arrays[k] for k in NODE_FIELDS})


# counts a manifest entry records of its shard (data_prep writes them; others may lack some)
ENTRY_COUNTS = ("num_inner_edges", "num_cross_edges", "class_counts", "num_train", "num_val",
                "num_test")


def shard_problems(shard: ClientShard, manifest: Manifest, client_id: int) -> list[str]:
    """Everything a loaded shard contradicts its manifest in (empty: nothing), as messages
    naming the field, the value found and the value expected: its attributes, sizes, label
    range, blocks, the counts its manifest entry records (``ENTRY_COUNTS``), its degrees
    against its blocks and its ascending global ids. One pass over the shard's arrays, no
    more: training checks every shard with it at set-up, ``data_prep verify`` too."""
    sizes = manifest.client_sizes()
    problems = []
    for key, expected in (("client_id", client_id), ("num_clients", manifest.num_clients),
                          ("format_version", FORMAT_VERSION), ("dataset", manifest.dataset),
                          ("partition", manifest.raw.get("partition")),
                          ("seed", manifest.raw.get("seed"))):
        if shard.attrs.get(key) != expected:
            problems.append(f"attribute {key} = {shard.attrs.get(key)!r}, expected {expected!r}")
    if shard.num_nodes != sizes[client_id]:
        problems.append(f"{shard.num_nodes} nodes, manifest says {sizes[client_id]}")
    if shard.x.shape[0] == shard.num_nodes and shard.x.shape[1] != manifest.num_features \
            and shard.x.size:
        problems.append(f"{shard.x.shape[1]} features, manifest says {manifest.num_features}")
    if shard.y.size and (shard.y.min() < 0 or shard.y.max() >= manifest.num_classes):
        problems.append(f"labels span [{shard.y.min()}, {shard.y.max()}], manifest says "
                        f"{manifest.num_classes} classes")
    for j, block in shard.blocks.items():
        if not 0 <= j < manifest.num_clients:
            problems.append(f"block /adj/{j} names a client outside 0..{manifest.num_clients - 1}")
        elif block.shape[1] != sizes[j]:
            problems.append(f"block /adj/{j} has {block.shape[1]} columns, client {j} has "
                            f"{sizes[j]} nodes")
    nnz = sum(b.nnz for b in shard.blocks.values())
    if nnz != int(shard.degree.sum()):
        problems.append(f"adjacency holds {nnz} entries but degrees sum to {int(shard.degree.sum())}")
    entry = manifest.clients[client_id]
    inner = shard.blocks.get(client_id)
    labels = shard.y[shard.y >= 0]
    found = {"num_inner_edges": int(inner.nnz // 2) if inner is not None else 0,
             "num_cross_edges": int(sum(b.nnz for j, b in shard.blocks.items() if j != client_id)),
             "class_counts": np.bincount(labels, minlength=max(manifest.num_classes, 0)).tolist(),
             "num_train": int(shard.train_mask.sum()), "num_val": int(shard.val_mask.sum()),
             "num_test": int(shard.test_mask.sum())}
    for key in ENTRY_COUNTS:
        if key in entry and entry[key] != found[key]:
            problems.append(f"{key} is {found[key]} in the shard, manifest says {entry[key]}")
    if shard.num_nodes > 1 and np.any(np.diff(shard.global_id) <= 0):
        problems.append("/nodes/global_id is not strictly ascending")
    row_sums = np.zeros(shard.num_nodes, dtype=np.int64)
    for block in shard.blocks.values():
        if block.shape[0] == shard.num_nodes:
            row_sums += np.diff(block.indptr)
    if shard.degree.shape == row_sums.shape and np.any(row_sums != shard.degree):
        bad = np.flatnonzero(row_sums != shard.degree)
        shown = ", ".join(str(int(i)) for i in bad[:5]) + (", ..." if bad.shape[0] > 5 else "")
        problems.append(f"/nodes/degree differs from the row sums of the blocks at "
                        f"{bad.shape[0]} nodes (local rows {shown})")
    return problems


def check_shard_against_manifest(shard: ClientShard, manifest: Manifest, client_id: int,
                                 path: str | os.PathLike) -> None:
    """Raise ShardError naming the file and every problem ``shard_problems`` finds."""
    problems = shard_problems(shard, manifest, client_id)
    if problems:
        raise ShardError(f"{path}: " + "; ".join(problems))


def assemble_global_graph(shards: list[ClientShard]) -> tuple[dict[str, np.ndarray], sp.csr_matrix]:
    """Reassemble the whole graph in global node order from all shards (tests, centralized mode).

    Returns (node arrays keyed like NODE_FIELDS minus global_id, adjacency CSR [n, n])."""
    n = sum(s.num_nodes for s in shards)
    order = np.concatenate([s.global_id for s in shards])
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ShardError("global ids over all shards are not a permutation of 0..n-1")
    rows, cols = [], []
    for i, shard in enumerate(shards):
        for j, block in shard.blocks.items():
            coo = block.tocoo()
            rows.append(shard.global_id[coo.row])
            cols.append(shards[j].global_id[coo.col])
    rows_all = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    cols_all = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    adj = sp.csr_matrix((np.ones(rows_all.shape[0], dtype=np.float32), (rows_all, cols_all)),
                        shape=(n, n))
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    nodes = {}
    for name in NODE_FIELDS[1:]:
        stacked = np.concatenate([getattr(s, name) for s in shards])
        nodes[name] = stacked[inverse]
    return nodes, adj
