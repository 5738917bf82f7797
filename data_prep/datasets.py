"""Dataset loaders: raw files in PyG/OGB layout (``data_prep.catalog``) -> ``GraphData``.

Raw files are never processed in place: PyG and OGB write ``processed/`` next to ``raw/``, so the
needed raw folders are copied into a fresh temporary directory under the cache dir (env
MPIFGL_CACHE, default ~/.cache/mpifgl) and loaded from there; it is named after its owner
(``<dataset>-<host>-<pid>-<random>``), so the copies of a killed run are removed by the next.
Missing raw files are detected here, before any loader runs, so an offline machine gets a clear
message instead of a network error; downloading happens only with ``download=True``
(``--download``)."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from fgl_common.ownership import owner_tag, remove_dead_owners

from .catalog import KNOWN_DATASETS, DatasetSpec, normalise_dataset_name
from .config import PrepConfig, SyntheticConfig, default_cache_dir
from .graph import GraphData, seed_stream, stratified_split, undirected_adjacency
from .progress import stage
from .raw_pickles import PLANETOID_OBJECTS, check_pickled_file

STRATIFIED_RULE = "stratified-60/20/20"


def default_data_root() -> Path:
    """Env MPIFGL_DATA_ROOT, else ``<repo>/../shared/data`` when it exists, else
    ``~/.cache/mpifgl/data`` (where ``--download`` puts files)."""
    env = os.environ.get("MPIFGL_DATA_ROOT")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parent.parent
    shared = repo.parent / "shared" / "data"
    if shared.is_dir():
        return shared
    return Path.home() / ".cache" / "mpifgl" / "data"


def missing_raw_files(spec: DatasetSpec, data_root: Path) -> list[Path]:
    """Raw files that are absent or unreadable (empty list when all are there)."""
    missing = []
    for rel in spec.raw_files:
        path = data_root / rel
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError:
            missing.append(path)
    return missing


def check_raw_files(spec: DatasetSpec, data_root: Path) -> None:
    missing = missing_raw_files(spec, data_root)
    if not missing:
        return
    listed = "\n  ".join(str(p) for p in missing)
    raise FileNotFoundError(
        f"dataset {spec.name}: {len(missing)} of {len(spec.raw_files)} raw files missing or "
        f"unreadable under data root {data_root}:\n  {listed}\n"
        f"To obtain them: {spec.how_to_obtain}; either rerun with --download on a machine with "
        f"network access, or copy the files to the paths above "
        f"(choose the folder with --data-root or env MPIFGL_DATA_ROOT).")


def scratch_parent(cache_dir: Path | None) -> Path:
    """Directory for temporary raw copies: the cache dir if writable, else the system temp dir."""
    parent = (cache_dir or default_cache_dir()) / "raw-copies"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if os.access(parent, os.W_OK):
            return parent
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def load_dataset(config: PrepConfig) -> GraphData:
    """Load (or generate) the dataset named in ``config`` as a canonical ``GraphData``."""
    name = normalise_dataset_name(config.dataset)
    if name == "synthetic":
        from .synthetic import generate_synthetic

        syn = config.synthetic
        if syn.seed is None:
            syn = SyntheticConfig(**{**syn.as_dict(), "seed": config.seed})
        return generate_synthetic(syn, split_seed=config.seed, show_progress=config.show_progress)
    spec = KNOWN_DATASETS[name]
    assert spec is not None
    data_root = Path(config.data_root) if config.data_root else default_data_root()
    missing = missing_raw_files(spec, data_root)
    if missing and not config.download:
        check_raw_files(spec, data_root)
    if missing:  # --download: the stock loader fetches into data_root itself
        with stage(f"downloading {name} into {data_root} (--download)", config.show_progress):
            data_root.mkdir(parents=True, exist_ok=True)
            with contextlib.redirect_stdout(sys.stderr):
                _allow_ogb_download_without_prompt()
                _run_loader(spec, data_root, name)
        check_raw_files(spec, data_root)
    copies = scratch_parent(config.cache_dir)
    remove_dead_owners(copies, f"{name}-")
    # The loaders chat on stdout and stderr (PyG's "Processing... Done!"): to stderr, or
    # nowhere with --quiet.
    chatter = sys.stderr if config.show_progress else io.StringIO()
    with tempfile.TemporaryDirectory(prefix=f"{name}-{owner_tag()}-", dir=copies) as scratch:
        with stage(f"loading {name} from {data_root} (copy in {scratch})", config.show_progress):
            scratch_root = Path(scratch)
            for rel in spec.copy_dirs:
                shutil.copytree(data_root / rel, scratch_root / rel)
            if spec.family == "ogb":  # without it OGB asks on stdin whether to re-download
                rel = Path(spec.raw_files[-1])
                shutil.copy2(data_root / rel, scratch_root / rel)
            if spec.family == "planetoid":  # pickles: the loader would run what they name
                for rel in spec.raw_files:
                    if not rel.endswith(".test.index"):  # a text file
                        check_pickled_file(scratch_root / rel, PLANETOID_OBJECTS,
                                           data_root / rel)
            try:
                with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
                    arrays = _run_loader(spec, scratch_root, name)
            except (KeyboardInterrupt, SystemExit, MemoryError):
                raise
            except Exception as exc:  # a corrupt raw file surfaces as anything from any loader
                raise ValueError(f"dataset {name}: could not read the raw files under "
                                 f"{data_root / spec.copy_dirs[0]} "
                                 f"({type(exc).__name__}: {exc})") from None
    with stage(f"canonicalising {name} (undirected, no self loops, deduplicated)",
               config.show_progress):
        return _to_graph(spec, arrays, config.seed, data_root)


def _allow_ogb_download_without_prompt() -> None:
    """OGB asks on stdin before downloading more than 1 GB; --download already said yes."""
    try:
        import ogb.nodeproppred.dataset_pyg as ogb_pyg
    except ImportError:
        return
    ogb_pyg.decide_download = lambda url: True


def _run_loader(spec: DatasetSpec, root: Path, name: str) -> dict[str, np.ndarray]:
    """Run the stock PyG/OGB loader with ``root`` as its root; return plain numpy arrays."""
    import torch_geometric.datasets as pyg  # heavy import, only where needed

    root_dir = str(root / spec.root_dir)
    family = spec.family
    split_idx = None
    if family == "planetoid":
        dataset = pyg.Planetoid(root_dir, spec.loader_name, split="full")
    elif family == "amazon":
        dataset = pyg.Amazon(root_dir, spec.loader_name)
    elif family == "coauthor":
        dataset = pyg.Coauthor(root_dir, spec.loader_name)
    elif family == "citationfull":
        dataset = pyg.CitationFull(root_dir, spec.loader_name)
    elif family == "actor":
        dataset = pyg.Actor(root_dir)
    elif family == "heterophilous":
        dataset = pyg.HeterophilousGraphDataset(root_dir, spec.loader_name)
    elif family == "reddit":
        dataset = pyg.Reddit(root_dir)
    elif family == "ogb":
        import torch
        from ogb.nodeproppred import PygNodePropPredDataset
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import GlobalStorage

        # OGB reads back its own processed file with a bare torch.load, which torch >= 2.6
        # restricts to plain tensors; the file was just written by OGB in our scratch copy, so
        # allow PyG's data classes.
        with torch.serialization.safe_globals([DataEdgeAttr, DataTensorAttr, GlobalStorage]):
            dataset = PygNodePropPredDataset(name=spec.loader_name, root=root_dir)
            split_idx = {k: np.asarray(v) for k, v in dataset.get_idx_split().items()}
    else:
        raise AssertionError(f"no loader for family {family}")
    data = dataset[0]
    arrays = {
        "x": data.x.numpy(),
        "y": data.y.numpy(),
        "edge_index": data.edge_index.numpy(),
        "num_nodes": np.int64(data.num_nodes),
    }
    if split_idx is not None:
        arrays["split_idx"] = split_idx
    elif spec.official_split is not None:
        for key in ("train_mask", "val_mask", "test_mask"):
            arrays[key] = getattr(data, key).numpy()
    return arrays


def _to_graph(spec: DatasetSpec, arrays: dict, seed: int, data_root: Path) -> GraphData:
    n = int(arrays["num_nodes"])
    x = np.ascontiguousarray(arrays["x"], dtype=np.float32)
    y = np.asarray(arrays["y"]).reshape(-1).astype(np.int64)  # OGB gives [n, 1]
    if y.shape[0] != n or x.shape[0] != n:
        raise ValueError(f"dataset {spec.name}: loader returned {x.shape[0]} feature rows and "
                         f"{y.shape[0]} labels for {n} nodes")
    if n and y.min() < 0:
        raise ValueError(f"dataset {spec.name}: {int((y < 0).sum())} nodes have no label "
                         f"(negative class); unlabelled nodes are not supported")
    edge_index = arrays["edge_index"]
    adjacency = undirected_adjacency(edge_index[0], edge_index[1], n)
    if "split_idx" in arrays:
        masks = []
        for key in ("train", "valid", "test"):
            mask = np.zeros(n, dtype=bool)
            mask[arrays["split_idx"][key]] = True
            masks.append(mask)
        train, val, test = masks
        split_rule = spec.official_split
    elif "train_mask" in arrays:
        train, val, test = (np.asarray(arrays[k], dtype=bool).reshape(n)
                            for k in ("train_mask", "val_mask", "test_mask"))
        split_rule = spec.official_split
    else:
        train, val, test = stratified_split(y, seed_stream(seed, "split"))
        split_rule = f"{STRATIFIED_RULE} seed={seed}"
    graph = GraphData(name=spec.name, adjacency=adjacency, x=x, y=y, train_mask=train,
                      val_mask=val, test_mask=test, num_classes=int(y.max()) + 1 if n else 0,
                      split_rule=split_rule,
                      source={"data_root": str(data_root), "raw_files": list(spec.raw_files),
                              "loader": f"{spec.family}:{spec.loader_name}"})
    graph.check()
    return graph
