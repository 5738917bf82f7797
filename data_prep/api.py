"""Python entry points: ``run_prep`` (one run from a PrepConfig) and ``prepare_shards`` (make sure
the shards of a request exist, reusing matching ones: for drivers that prepare many)."""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fgl_common import shard_format

from .catalog import normalise_dataset_name
from .config import DEFAULT_SPLIT, DEFAULT_SPLIT_BY, PartitionConfig, PrepConfig, SyntheticConfig
from .datasets import load_dataset
from .partition import partition_nodes
from .verify import verify_shard_dir
from .writer import check_output_target, restore_interrupted_replacement, write_shard_directory


@dataclass
class PrepResult:
    manifest: dict[str, Any]
    out: Path
    seconds: float
    peak_rss_mb: float


def request_record(config: PrepConfig) -> dict[str, Any]:
    """What was asked for, stored in the manifest so a later run can tell whether it matches."""
    name = normalise_dataset_name(config.dataset)
    record: dict[str, Any] = {"dataset": name, "num_clients": config.num_clients,
                              "partition": config.partition.method, "seed": config.seed}
    if config.partition.method == "label-skew":
        record["favoured_classes"] = config.partition.favoured_classes
        record["skew_factor"] = config.partition.skew_factor
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
    graph = load_dataset(config)
    check_finite_features(graph)
    partition = partition_nodes(graph, config.num_clients, config.partition, config.seed,
                                config.show_progress)
    manifest_extra = {"partition": config.partition.method,
                      "partition_params": partition.params,
                      "request": request_record(config)}
    manifest = write_shard_directory(graph, partition, out, config.force, manifest_extra,
                                     config.seed, config.show_progress)
    return PrepResult(manifest, out, time.perf_counter() - start, peak_rss_mb())


def check_finite_features(graph) -> None:
    """Refuse NaN or infinite features: training on them yields NaN, never a result."""
    found = shard_format.non_finite_rows(graph.x)
    if found is None:
        return
    source = graph.source.get("data_root")
    origin = (f"the raw files of {graph.name} under {source}" if source
              else f"the generated dataset {graph.name}")
    raise ValueError(f"{origin}: the node features (dataset x) hold non-finite values: "
                     f"{shard_format.describe_non_finite(found, 'node')}; no shards written")


_SYN_PREFIX = "syn_"


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
    part_values = {k: options.pop(k) for k in ("favoured_classes", "skew_factor") if k in options}
    plain = {k: options.pop(k) for k in ("download", "cache_dir", "show_progress")
             if k in options}
    if options:
        raise ValueError(f"unknown options {sorted(options)}; known: favoured_classes, "
                         f"skew_factor, download, cache_dir, show_progress, synthetic, "
                         + ", ".join(_SYN_PREFIX + f for f in sorted(syn_fields)))
    if out is None:
        out = shard_format.default_shard_dir(normalise_dataset_name(dataset), num_clients,
                                             partition, seed)
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
