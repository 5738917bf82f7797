"""A user's own graph (``--graph PATH``, ``data_prep.write_shards``) -> ``GraphData``.

Inputs, all read without unpickling arbitrary objects:

- ``.npz`` (``np.load(..., allow_pickle=False)``) with keys ``edge_index`` [2, E], ``x`` [n, d],
  ``y`` [n], optionally ``num_nodes`` and a split: ``train_mask``/``val_mask``/``test_mask`` [n]
  or ``train_idx``/``val_idx``/``test_idx`` (node ids);
- ``.pt``/``.pth`` (``torch.save``) of a dict of tensors with those keys or of a PyG ``Data``
  (``torch.load(..., weights_only=True)``, PyG's Data classes allowed and nothing else);
- a folder in OGB's node-property layout: ``raw/edge.csv.gz``, ``raw/num-node-list.csv.gz``,
  ``raw/node-feat.csv.gz``, ``raw/node-label.csv.gz`` and optionally one
  ``split/<name>/{train,valid,test}.csv.gz`` (what ``ogb.io.read_csv_graph_raw`` and
  ``PygNodePropPredDataset.get_idx_split`` read);
- in Python, a dict of numpy arrays or tensors, or a PyG ``Data``.

Every check names the input, the key, the value found and the value expected. Edges are made
undirected, self loops and repeated entries dropped, and each change counted (``EdgeCleaning``,
recorded in the manifest's ``source``). Without a split the stratified 60/20/20 split of the
catalog's datasets is drawn, seeded by ``--seed``."""
from __future__ import annotations

import re
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .datasets import STRATIFIED_RULE
from .graph import GraphData, adjacency_from_keys, seed_stream, stratified_split

REQUIRED_KEYS = ("edge_index", "x", "y")
MASK_KEYS = ("train_mask", "val_mask", "test_mask")
INDEX_KEYS = ("train_idx", "val_idx", "test_idx")
TORCH_SUFFIXES = (".pt", ".pth")
OGB_FILES = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/node-feat.csv.gz",
             "raw/node-label.csv.gz")
OGB_SPLIT_FILES = ("train", "valid", "test")  # OGB's names, our train/val/test
KEYS_HELP = ("expected edge_index [2, E], x [n, d], y [n] and optionally train_mask/val_mask/"
             "test_mask or train_idx/val_idx/test_idx")


@dataclass(frozen=True)
class EdgeCleaning:
    """What making the edge list canonical changed, counted on the input's entries."""

    entries: int  # columns of edge_index as given
    self_loops_removed: int
    duplicates_removed: int  # repeated (u, v) entries, u != v
    reverse_edges_added: int  # (v, u) added where only (u, v) was given
    undirected_edges: int  # what the graph has afterwards

    def describe(self) -> str:
        return (f"edge_index: {self.entries:,} entries; {self.self_loops_removed:,} self loops "
                f"and {self.duplicates_removed:,} duplicates removed, "
                f"{self.reverse_edges_added:,} reverse edges added: "
                f"{self.undirected_edges:,} undirected edges")


def graph_name(path: Path) -> str:
    """A dataset name from a file or folder name: lowercase, safe in a directory name."""
    stem = path.name if path.is_dir() else path.stem
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.") or "graph"


# -- reading files ------------------------------------------------------------------------------
def read_graph_file(path: Path) -> dict[str, Any]:
    """The arrays of a graph file or OGB folder (see the module docstring), unchecked."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--graph {path}: no such file or folder (expected an .npz, a "
                                f".pt or a folder in OGB's node-property layout)")
    if path.is_dir():
        return read_ogb_folder(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix in TORCH_SUFFIXES:
        return read_torch_file(path)
    raise ValueError(f"--graph {path}: unknown format {suffix or '(no suffix)'!r}, expected "
                     f".npz, .pt/.pth or a folder in OGB's node-property layout")


def read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable .npz file ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a single array, expected an .npz archive of named "
                         f"arrays ({KEYS_HELP})")
    arrays = {}
    with archive:
        for key in archive.files:
            try:
                arrays[key] = archive[key]
            except ValueError as exc:  # an object array needs pickle: refused
                if "allow_pickle" in str(exc):
                    raise ValueError(f"{path}: key {key!r} is an array of Python objects "
                                     f"(pickled), expected a numeric array; save it with a "
                                     f"numeric dtype") from None
                raise ValueError(f"{path}: key {key!r} unreadable ({exc})") from None
            except (OSError, zipfile.BadZipFile, EOFError) as exc:
                raise ValueError(f"{path}: key {key!r} unreadable ({exc})") from None
    return arrays


def read_torch_file(path: Path) -> dict[str, Any]:
    """A dict of tensors or a PyG Data from ``torch.save``, loaded with ``weights_only=True``:
    plain tensors and containers, plus PyG's Data classes (what PyG itself allows)."""
    import pickle

    import torch  # only for this format: data_prep's driver imports no torch

    allowed = []
    try:
        from torch_geometric.data import Data
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import GlobalStorage
        allowed = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
    except ImportError:  # without PyG a dict of tensors still loads
        pass
    # safe_globals removes its list again on exit: leave out what PyG registered for good
    registered = torch.serialization.get_safe_globals()
    allowed = [cls for cls in allowed if cls not in registered]
    try:
        with torch.serialization.safe_globals(allowed):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's reader raises many kinds on a file that is not its own
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if isinstance(exc, pickle.UnpicklingError) and found:
            raise ValueError(f"{path}: loading it needs unpickling of the class "
                             f"{found.group(1)}; expected a dict of tensors or a "
                             f"torch_geometric Data saved with torch.save (arbitrary objects "
                             f"are never unpickled)") from None
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        raise ValueError(f"{path}: not a readable torch.save file ({type(exc).__name__}"
                         f"{': ' + reason if reason else ''})") from None
    return arrays_of(loaded, str(path))


def read_ogb_folder(folder: Path) -> dict[str, Any]:
    """OGB's node-property layout, read as ``ogb.io.read_csv_graph_raw`` does (pandas, no
    header): one graph, edges as rows of two ids, labels one column (NaN: unlabelled)."""
    import pandas as pd  # only for this format

    missing = [name for name in OGB_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"--graph {folder}: {', '.join(missing)} missing; expected OGB's node-property "
            f"layout: {', '.join(OGB_FILES)} and optionally split/<name>/"
            f"{{{','.join(OGB_SPLIT_FILES)}}}.csv.gz")

    def table(relative: str) -> np.ndarray:
        try:
            return pd.read_csv(folder / relative, compression="gzip", header=None).values
        except Exception as exc:  # pandas raises many kinds on a damaged file
            raise ValueError(f"{folder / relative}: unreadable ({type(exc).__name__}: "
                             f"{exc})") from None

    node_counts = table("raw/num-node-list.csv.gz").reshape(-1)
    if node_counts.shape[0] != 1:
        raise ValueError(f"{folder / 'raw/num-node-list.csv.gz'}: lists {node_counts.shape[0]} "
                         f"graphs, expected 1 (node property prediction on one graph)")
    edges = table("raw/edge.csv.gz")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"{folder / 'raw/edge.csv.gz'}: rows of {edges.shape[-1]} values, "
                         f"expected rows of two node ids")
    arrays: dict[str, Any] = {"edge_index": edges.T, "num_nodes": node_counts[0],
                              "x": table("raw/node-feat.csv.gz"),
                              "y": table("raw/node-label.csv.gz")}
    splits = sorted(p for p in (folder / "split").glob("*") if p.is_dir())
    if len(splits) > 1:
        raise ValueError(f"{folder / 'split'}: holds {len(splits)} splits "
                         f"({', '.join(p.name for p in splits)}), expected one")
    if splits:
        for ours, theirs in zip(INDEX_KEYS, OGB_SPLIT_FILES):
            relative = f"split/{splits[0].name}/{theirs}.csv.gz"
            if not (folder / relative).is_file():
                raise FileNotFoundError(f"--graph {folder}: {relative} missing (a split needs "
                                        f"{', '.join(OGB_SPLIT_FILES)})")
            arrays[ours] = table(relative).reshape(-1)
    return arrays


def arrays_of(data: Any, origin: str) -> dict[str, Any]:
    """The named arrays of a dict or a PyG Data (duck-typed: anything with ``to_dict``)."""
    if isinstance(data, Mapping):
        values = dict(data)
    elif hasattr(data, "to_dict") and callable(data.to_dict):
        values = dict(data.to_dict())
        if "num_nodes" not in values and getattr(data, "num_nodes", None) is not None:
            values["num_nodes"] = data.num_nodes
    else:
        raise ValueError(f"{origin}: holds a {type(data).__name__}, expected a dict of arrays or "
                         f"tensors or a torch_geometric Data ({KEYS_HELP})")
    nested = sorted(k for k, v in values.items() if isinstance(v, Mapping))
    if nested:
        raise ValueError(f"{origin}: keys {nested} hold nested dicts (a heterogeneous graph?), "
                         f"expected one node type: {KEYS_HELP}")
    return {str(k): _as_numpy(v) for k, v in values.items()}


def _as_numpy(value: Any) -> Any:
    """Tensors (duck-typed: no torch import here) to numpy; other values unchanged."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        if getattr(value, "is_sparse", False) or str(getattr(value, "layout", "")) != \
                "torch.strided":
            value = value.to_dense()
        return value.detach().cpu().numpy()
    return value


# -- checking and canonicalising ----------------------------------------------------------------
def _numeric(origin: str, key: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{origin}: {key} has dtype {array.dtype}, expected a numeric array")
    return array


def _integers(origin: str, key: str, value: Any, what: str) -> np.ndarray:
    """An integer array (a float one only when every value is a whole number)."""
    array = _numeric(origin, key, value)
    if array.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)))
        if bad.size:
            where = np.unravel_index(bad[0], array.shape)
            raise ValueError(f"{origin}: {key} holds {array[where]} at {list(map(int, where))}, "
                             f"expected integer {what}")
    elif array.dtype.kind == "b":
        raise ValueError(f"{origin}: {key} has dtype bool, expected integer {what}")
    return array.astype(np.int64)


def check_node_ids(origin: str, key: str, ids: np.ndarray, num_nodes: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        bad = ids[(ids < 0) | (ids >= num_nodes)].reshape(-1)[0]
        raise ValueError(f"{origin}: {key} holds node id {int(bad)}, expected ids in "
                         f"0..{num_nodes - 1} (the graph has {num_nodes} nodes)")


def clean_edges(edge_index: np.ndarray, num_nodes: int):
    """Canonical adjacency (undirected, no self loops, no duplicates) and what changed."""
    src = np.asarray(edge_index[0], dtype=np.int64)
    dst = np.asarray(edge_index[1], dtype=np.int64)
    entries = int(src.shape[0])
    keep = src != dst
    loops = entries - int(keep.sum())
    n64 = np.int64(num_nodes)
    directed = np.unique(src[keep] * n64 + dst[keep])
    del src, dst, keep
    lo = np.minimum(directed // n64, directed % n64)
    hi = np.maximum(directed // n64, directed % n64)
    undirected = np.unique(lo * n64 + hi)
    del lo, hi
    cleaning = EdgeCleaning(entries, loops, entries - loops - int(directed.shape[0]),
                            2 * int(undirected.shape[0]) - int(directed.shape[0]),
                            int(undirected.shape[0]))
    return adjacency_from_keys(undirected, num_nodes), cleaning


def _split(arrays: dict[str, Any], origin: str, n: int, y: np.ndarray, seed: int):
    """(train, val, test, split rule): the masks or index arrays given, else the default."""
    masks_given = [k for k in MASK_KEYS if k in arrays]
    index_given = [k for k in INDEX_KEYS if k in arrays]
    if masks_given and index_given:
        raise ValueError(f"{origin}: both masks ({', '.join(masks_given)}) and index arrays "
                         f"({', '.join(index_given)}) given, expected one form of the split")
    if not masks_given and not index_given:
        train, val, test = stratified_split(y, seed_stream(seed, "split"))
        return train, val, test, f"{STRATIFIED_RULE} seed={seed}"
    keys = MASK_KEYS if masks_given else INDEX_KEYS
    absent = [k for k in keys if k not in arrays]
    if absent:
        raise ValueError(f"{origin}: missing key {absent[0]!r} (the split gives "
                         f"{', '.join(k for k in keys if k in arrays)}; expected all of "
                         f"{', '.join(keys)})")
    sets = []
    for key in keys:
        value = np.asarray(arrays[key])
        if masks_given:
            if value.shape != (n,):
                raise ValueError(f"{origin}: {key} has shape {value.shape}, expected ({n},) "
                                 f"(one entry per node)")
            if value.dtype.kind != "b":
                value = _integers(origin, key, value, "0/1 mask values")
                if value.size and (value.min() < 0 or value.max() > 1):
                    raise ValueError(f"{origin}: {key} holds {int(value.max())}, expected a "
                                     f"boolean mask (0/1)")
            sets.append(value.astype(bool))
        else:
            ids = _integers(origin, key, value, "node ids").reshape(-1)
            check_node_ids(origin, key, ids, n)
            mask = np.zeros(n, dtype=bool)
            mask[ids] = True
            sets.append(mask)
    for a in range(3):
        for b in range(a + 1, 3):
            both = np.flatnonzero(sets[a] & sets[b])
            if both.size:
                raise ValueError(f"{origin}: {keys[a]} and {keys[b]} overlap at {both.size} "
                                 f"nodes (first: node {int(both[0])}), expected disjoint sets")
    return (*sets, "given (" + "/".join(keys) + ")")


def graph_from_arrays(arrays: dict[str, Any], name: str, origin: str, seed: int,
                      source: dict[str, Any] | None = None) -> GraphData:
    """Check a user's arrays and build the canonical ``GraphData``; ``origin`` names the input
    in every message (a path, or ``write_shards(data)``)."""
    absent = [k for k in REQUIRED_KEYS if k not in arrays]
    if absent:
        raise ValueError(f"{origin}: missing key {absent[0]!r} ({KEYS_HELP}; found keys: "
                         f"{', '.join(sorted(arrays)) or 'none'})")
    x = _numeric(origin, "x", arrays["x"])
    if x.ndim != 2:
        raise ValueError(f"{origin}: x has shape {x.shape}, expected [n, d] (one feature row "
                         f"per node)")
    n = int(x.shape[0])
    if n == 0:
        raise ValueError(f"{origin}: x has 0 rows, expected at least one node")
    if arrays.get("num_nodes") is not None:
        given = int(np.asarray(arrays["num_nodes"]).reshape(-1)[0])
        if given != n:
            raise ValueError(f"{origin}: num_nodes is {given} but x has {n} rows, expected "
                             f"the same")
    y = np.asarray(arrays["y"])
    if y.ndim == 2 and y.shape[1] == 1:  # OGB's [n, 1]
        y = y[:, 0]
    if y.shape != (n,):
        raise ValueError(f"{origin}: y has shape {y.shape}, expected ({n},) (one class id per "
                         f"node, x has {n} rows; multi-label targets are not supported)")
    y = _integers(origin, "y", y, "class ids >= 0 (unlabelled nodes are not supported)")
    if y.min() < 0:
        first = int(np.flatnonzero(y < 0)[0])
        raise ValueError(f"{origin}: y holds {int(y[first])} at node {first}, expected class "
                         f"ids >= 0 (unlabelled nodes are not supported)")
    edge_index = np.asarray(arrays["edge_index"])
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{origin}: edge_index has shape {edge_index.shape}, expected [2, E] "
                         f"(row 0 sources, row 1 targets)")
    edge_index = _integers(origin, "edge_index", edge_index, "node ids")
    check_node_ids(origin, "edge_index", edge_index, n)
    train, val, test, split_rule = _split(arrays, origin, n, y, seed)
    if not train.any():
        raise ValueError(f"{origin}: the split has no training node, expected at least one")
    adjacency, cleaning = clean_edges(edge_index, n)
    graph = GraphData(name=name, adjacency=adjacency, x=np.ascontiguousarray(x, np.float32),
                      y=y, train_mask=train, val_mask=val, test_mask=test,
                      num_classes=int(y.max()) + 1, split_rule=split_rule,
                      source={**(source or {}), "edge_cleaning": asdict(cleaning)})
    graph.check()
    return graph


def load_user_graph(path: Path, name: str | None, seed: int) -> GraphData:
    """``--graph PATH`` as a ``GraphData`` named ``name`` (default: from the file name)."""
    path = Path(path)
    arrays = read_graph_file(path)
    kind = "ogb-folder" if path.is_dir() else path.suffix.lower().lstrip(".")
    return graph_from_arrays(arrays, name or graph_name(path), str(path), seed,
                             {"graph": str(path.resolve()), "format": kind})

