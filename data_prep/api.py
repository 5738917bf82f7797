"""Python entry points: ``run_prep`` (one run from a PrepConfig), ``prepare_shards`` (make sure
the shards of a request exist, reusing matching ones: for drivers that prepare many),
``write_shards`` (a graph built in Python, or a graph file, to shards) and ``read_assignment``
(the client of every node, back from a shard directory)."""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fgl_common import shard_format

from .catalog import normalise_dataset_name
from .config import DEFAULT_SPLIT, DEFAULT_SPLIT_BY, PartitionConfig, PrepConfig, SyntheticConfig
from .datasets import load_dataset
from .graph import GraphData
from .partition import Partition, check_assignment, partition_nodes
from .user_graph import arrays_of, graph_from_arrays, load_user_graph
from .verify import verify_shard_dir
from .writer import check_output_target, restore_interrupted_replacement, write_shard_directory


@dataclass
class PrepResult:
    manifest: dict[str, Any]
    out: Path
    seconds: float
    peak_rss_mb: float
    partition_seconds: float = 0.0


def request_record(config: PrepConfig) -> dict[str, Any]:
    """What was asked for, stored in the manifest so a later run can tell whether it matches."""
    if config.graph is not None:
        source: dict[str, Any] = {"graph": str(Path(config.graph).resolve())}
        if config.graph_name is not None:
            source["graph_name"] = config.graph_name
    else:
        source = {"dataset": normalise_dataset_name(config.dataset)}
    name = source.get("dataset")
    record: dict[str, Any] = {**source, "num_clients": config.num_clients,
                              "partition": config.partition.method, "seed": config.seed}
    if config.partition.method == "label-skew":
        record["favoured_classes"] = config.partition.favoured_classes
        record["skew_factor"] = config.partition.skew_factor
    if config.partition.method == "dirichlet":
        record["beta"] = config.partition.beta
        record["min_client_nodes"] = config.partition.min_client_nodes
    if config.partition.method == "louvain":
        record["louvain_delta"] = config.partition.louvain_delta
    if name == "synthetic":
        syn = config.synthetic.as_dict()
        syn["seed"] = config.seed if syn["seed"] is None else syn["seed"]
        syn["edges"] = config.synthetic.num_edges
        syn.pop("avg_degree")  # edges is the resolved quantity
        for knob in ("class_skew", "degree_skew", "label_noise"):
            if syn[knob] == 0:  # off: requests recorded before the knob existed still match
                syn.pop(knob)
        if tuple(syn["split"]) == DEFAULT_SPLIT:  # likewise for the 60/20/20 split
            syn.pop("split")
        if syn["split_by"] == DEFAULT_SPLIT_BY:  # and for the split inside every class
            syn.pop("split_by")
        record["synthetic"] = syn
    return record


def peak_rss_mb() -> float:
    """Peak resident set size of this process and of its waited-for children, in MB (Linux KB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def run_prep(config: PrepConfig) -> PrepResult:
    """Validate, load, partition, write and verify; raise ValueError/FileNotFoundError/
    FileExistsError/OSError with a message for the user on bad input."""
    start = time.perf_counter()
    config.validate()
    out = Path(config.out)
    restore_interrupted_replacement(out)  # never lost as litter (writer's docstring)
    check_output_target(out, config.force)  # before the (possibly long) load
    if config.graph is not None:
        graph = load_user_graph(config.graph, config.graph_name, config.seed)
    else:
        graph = load_dataset(config)
    check_finite_features(graph)
    partition = partition_nodes(graph, config.num_clients, config.partition, config.seed,
                                config.show_progress)
    return _write(graph, partition, config.partition.kind, request_record(config), config.seed,
                  out, config.force, config.show_progress, start)


def _write(graph: GraphData, partition: Partition, kind: str, request: dict[str, Any],
           seed: int, out: Path, force: bool, show_progress: bool, start: float) -> PrepResult:
    manifest_extra = {"partition": kind, "partition_params": partition.params,
                      "request": request}
    manifest = write_shard_directory(graph, partition, out, force, manifest_extra, seed,
                                     show_progress)
    return PrepResult(manifest, out, time.perf_counter() - start, peak_rss_mb(),
                      partition.seconds)


def check_finite_features(graph) -> None:
    """Refuse NaN or infinite features: training on them yields NaN, never a result."""
    found = shard_format.non_finite_rows(graph.x)
    if found is None:
        return
    source = graph.source.get("data_root")
    origin = (f"the raw files of {graph.name} under {source}" if source
              else f"{graph.source['graph']}" if "graph" in graph.source
              else f"the generated dataset {graph.name}")
    raise ValueError(f"{origin}: the node features (dataset x) hold non-finite values: "
                     f"{shard_format.describe_non_finite(found, 'node')}; no shards written")


_SYN_PREFIX = "syn_"
PYTHON_ORIGIN = "write_shards(data)"  # how messages and the manifest name a graph from Python
# the keyword options of a partition (PartitionConfig's fields but the method)
PARTITION_OPTIONS = tuple(f.name for f in fields(PartitionConfig) if f.name != "method")


def config_from_options(dataset: str, num_clients: int, partition: str, seed: int,
                        data_root: str | Path | None, out: str | Path | None, force: bool,
                        options: dict[str, Any]) -> PrepConfig:
    """Build a PrepConfig from keyword options: favoured_classes, skew_factor, download,
    cache_dir, show_progress, syn_<field> (or synthetic=SyntheticConfig / dict)."""
    options = dict(options)
    syn_fields = {f.name for f in fields(SyntheticConfig)}
    synthetic = options.pop("synthetic", None)
    if isinstance(synthetic, dict):
        synthetic = SyntheticConfig(**synthetic)
    syn_values = {k[len(_SYN_PREFIX):]: options.pop(k) for k in list(options)
                  if k.startswith(_SYN_PREFIX) and k[len(_SYN_PREFIX):] in syn_fields}
    if synthetic is None:
        synthetic = SyntheticConfig(**syn_values)
    elif syn_values:
        synthetic = SyntheticConfig(**{**synthetic.as_dict(), **syn_values})
    part_values = {k: options.pop(k) for k in PARTITION_OPTIONS if k in options}
    plain = {k: options.pop(k) for k in ("download", "cache_dir", "show_progress")
             if k in options}
    if options:
        raise ValueError(f"unknown options {sorted(options)}; known: "
                         f"{', '.join(PARTITION_OPTIONS)}, download, cache_dir, show_progress, "
                         f"synthetic, " + ", ".join(_SYN_PREFIX + f for f in sorted(syn_fields)))
    if out is None:
        out = shard_format.default_shard_dir(normalise_dataset_name(dataset), num_clients,
                                             PartitionConfig(method=partition).kind, seed)
    if plain.get("cache_dir") is not None:
        plain["cache_dir"] = Path(plain["cache_dir"])
    return PrepConfig(dataset=dataset, num_clients=num_clients, out=Path(out),
                      partition=PartitionConfig(method=partition, **part_values), seed=seed,
                      data_root=Path(data_root) if data_root is not None else None, force=force,
                      synthetic=synthetic, **plain)


def prepare_shards(dataset: str, num_clients: int, partition: str = "random", seed: int = 0,
                   data_root: str | None = None, out: str | Path | None = None,
                   force: bool = False, **options: Any) -> dict[str, Any]:
    """Make sure ``out`` holds verified shards for this request and return their manifest.

    ``out`` defaults to ``shards/<dataset>-<partition>-m<M>-s<S>`` in the working directory
    (``fgl_common.shard_format.default_shard_dir``). If ``out`` already holds shards written for
    the same request and they verify, nothing is written. If it holds something else,
    FileExistsError unless ``force=True`` (then it is replaced, atomically). Two processes
    preparing the same shards at once: the loser checks the winner's manifest and returns it.
    ``options``: see ``config_from_options``."""
    config = config_from_options(dataset, num_clients, partition, seed, data_root, out, force,
                                 options)
    config.validate()
    target = Path(config.out)
    if target.exists() and not force:
        existing = _matching_manifest(target, request_record(config))
        if existing is not None:
            return existing
        raise FileExistsError(f"{target} exists but does not hold verified shards for "
                              f"{request_record(config)}; pass force=True to replace it")
    try:
        return run_prep(config).manifest
    except OSError:  # FileExistsError, or ENOTEMPTY from the final rename
        winner = None if force else _matching_manifest(target, request_record(config))
        if winner is None:
            raise
        return winner  # another process prepared the same shards meanwhile


def _matching_manifest(target: Path, request: dict[str, Any]) -> dict[str, Any] | None:
    manifest_path = target / shard_format.MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("request") != request:
        return None
    return manifest if verify_shard_dir(target).ok else None


def write_shards(data: Any, num_clients: int, partition: Any = "random",
                 out: str | Path | None = None, *, seed: int = 0, name: str | None = None,
                 force: bool = False, show_progress: bool = False,
                 **partition_options: Any) -> dict[str, Any]:
    """Partition a graph built in Python and write verified shards to ``out``; return the
    manifest.

    ``data``: a dict of numpy arrays or tensors, or a PyG ``Data``, with ``edge_index`` [2, E],
    ``x`` [n, d], ``y`` [n] and optionally ``train_mask``/``val_mask``/``test_mask`` or
    ``train_idx``/``val_idx``/``test_idx`` (else the seeded stratified 60/20/20 split); or the
    path of a graph file (``--graph``). ``partition``: a method name (``--partition``: random,
    label-skew, metis, dirichlet, louvain, file:PATH) with its ``partition_options`` (beta,
    min_client_nodes, louvain_delta, favoured_classes, skew_factor), or the client of every
    node as an integer array of length n (recorded as partition ``given``). ``out`` is
    required; an existing one is replaced only with ``force=True``. ``name``: the dataset name
    in the manifest (default: the file's stem, or ``graph``). Bad input raises ValueError
    naming the key, the value found and the value expected; nothing is written."""
    start = time.perf_counter()
    if out is None:
        raise ValueError("write_shards: out is required (the shard directory to create)")
    if num_clients < 1:
        raise ValueError(f"write_shards: num_clients must be >= 1, got {num_clients}")
    if seed < 0:
        raise ValueError(f"write_shards: seed must be >= 0, got {seed}")
    unknown = sorted(set(partition_options) - set(PARTITION_OPTIONS))
    if unknown:
        raise ValueError(f"write_shards: unknown options {unknown}, expected some of "
                         f"{', '.join(PARTITION_OPTIONS)}")
    given = None if isinstance(partition, str) else partition
    method = PartitionConfig(method="random" if given is not None else partition,
                             **partition_options)
    method.validate(num_clients)
    out = Path(out)
    check_output_target(out, force)
    if isinstance(data, (str, Path)):
        graph = load_user_graph(Path(data), name, seed)
        request = request_record(PrepConfig(num_clients=num_clients, out=out, graph=Path(data),
                                            graph_name=name, partition=method, seed=seed))
    else:
        graph = graph_from_arrays(arrays_of(data, PYTHON_ORIGIN), name or "graph",
                                  PYTHON_ORIGIN, seed, {"graph": PYTHON_ORIGIN})
        request = {"graph": PYTHON_ORIGIN, "num_clients": num_clients,
                   "partition": method.method, "seed": seed}
    check_finite_features(graph)
    if given is None:
        parts = partition_nodes(graph, num_clients, method, seed, show_progress)
        kind = method.kind
    else:
        assignment = np.asarray(given).reshape(-1)
        if assignment.shape[0] != graph.num_nodes:
            raise ValueError(f"write_shards(partition): {assignment.shape[0]} client ids, "
                             f"expected {graph.num_nodes} (one per node, in node order)")
        parts = Partition(check_assignment(assignment, num_clients, "write_shards(partition)"),
                          num_clients)
        kind = request["partition"] = "given"
    return _write(graph, parts, kind, request, seed, out, force, show_progress, start).manifest


def read_assignment(shard_dir: str | Path) -> np.ndarray:
    """The client of every node (int32 [n], global node order) of a shard directory: what
    ``--partition file:`` reads back to rebuild the same clients."""
    shard_dir = Path(shard_dir)
    manifest = shard_format.read_manifest(shard_dir)
    assignment = np.full(manifest.num_nodes, -1, dtype=np.int32)
    for client, entry in enumerate(manifest.clients):
        path = shard_dir / entry["file"]
        try:
            with h5py.File(path, "r") as f:
                ids = np.asarray(f["nodes/global_id"][()], dtype=np.int64)
        except (OSError, KeyError) as exc:
            raise shard_format.ShardError(f"{path}: /nodes/global_id unreadable ({exc})") \
                from None
        if ids.size and (ids.min() < 0 or ids.max() >= manifest.num_nodes):
            raise shard_format.ShardError(f"{path}: global ids outside 0..{manifest.num_nodes - 1}")
        assignment[ids] = client
    if (assignment < 0).any():
        raise shard_format.ShardError(f"{shard_dir}: {int((assignment < 0).sum())} nodes belong "
                                      f"to no client")
    return assignment
