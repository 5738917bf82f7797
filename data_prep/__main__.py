"""Command line of data_prep (console script ``mpifgl-data-prep``).

    python -m data_prep --dataset NAME --num-clients M --partition random|label-skew|metis \
        --seed S --data-root DIR --out SHARD_DIR [--force] [--download] [--syn-... ]
    python -m data_prep --graph PATH --num-clients M --partition dirichlet|louvain|file:PATH ...
    python -m data_prep verify SHARD_DIR
    python -m data_prep assignment SHARD_DIR OUT.npy

User mistakes end with ``data_prep: error: ...`` on stderr and exit status 2 (no traceback);
verify exits 1 when it finds problems."""
from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, explicit_dests, option
from fgl_common.diskspace import DiskFullError, disk_full_error, is_disk_full

from .api import PrepResult, read_assignment, run_prep
from .config import PartitionConfig, PrepConfig, SyntheticConfig
from .proxies import PROXIES, proxy
from .user_graph import EdgeCleaning
from .verify import verify_shard_dir

PROG = "data_prep"
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, OSError)
SYNTHETIC_PREFIX = "syn-"
NESTED = ("partition", "synthetic")  # PrepConfig fields that are configs with flags of their own
PARTITION_KNOBS = {"label-skew partition": ("favoured_classes", "skew_factor"),
                   "dirichlet partition": ("beta", "min_client_nodes"),
                   "louvain partition": ("louvain_delta",)}


@dataclass(frozen=True)
class ProxyArgs:
    """A preset of the --syn-* flags standing in for a graph of the paper (data_prep/proxies.py)."""

    proxy: str = option("", "preset of the --syn-* flags for a synthetic stand-in of a real "
                            "graph (" + ", ".join(PROXIES) + "): its size, feature width, "
                            "classes, split and calibrated feature signal, homophily, skews and "
                            "label noise (docs/paper_scale.md); --syn-* flags given as well "
                            "override the preset")
    scale: float = option(1.0, "with --syn-proxy: fraction of the real graph's nodes and edges "
                               "(the mean degree stays the real graph's)")


def build_parser() -> argparse.ArgumentParser:
    """The flags of PrepConfig, --partition and its label-skew knobs, and --syn-<field>."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Partition a graph dataset (or your own, --graph) over M clients and write "
                    "one HDF5 shard per client plus manifest.json. `python -m data_prep verify "
                    "SHARD_DIR` checks a shard directory; `python -m data_prep assignment "
                    "SHARD_DIR OUT` writes the client of every node.")
    first = ("dataset", "graph", "graph_name", "num_clients", "out")
    add_dataclass_arguments(parser, PrepConfig, only=first)
    add_dataclass_arguments(parser, PartitionConfig, only=("method",))
    add_dataclass_arguments(parser, PrepConfig, exclude=(*first, *NESTED))
    for title, knobs in PARTITION_KNOBS.items():
        add_dataclass_arguments(parser.add_argument_group(title), PartitionConfig, only=knobs)
    syn = parser.add_argument_group("synthetic dataset (--dataset synthetic)")
    add_dataclass_arguments(syn, ProxyArgs, SYNTHETIC_PREFIX)
    add_dataclass_arguments(syn, SyntheticConfig, SYNTHETIC_PREFIX)
    return parser


def synthetic_from_args(args: argparse.Namespace, explicit: set[str]) -> SyntheticConfig:
    """The --syn-* flags; with --syn-proxy the preset at --syn-scale, then the flags given."""
    given = dataclass_from_namespace(SyntheticConfig, args, SYNTHETIC_PREFIX)
    preset = dataclass_from_namespace(ProxyArgs, args, SYNTHETIC_PREFIX)
    if not preset.proxy:
        if preset.scale != 1.0:
            raise ValueError(f"--syn-scale {preset.scale} needs --syn-proxy (it scales a "
                             f"preset's real size)")
        return given
    values = proxy(preset.proxy).config(preset.scale).as_dict()
    for name, value in given.as_dict().items():
        if SYNTHETIC_PREFIX.replace("-", "_") + name in explicit:
            values[name] = value
    if "syn_avg_degree" in explicit and "syn_edges" not in explicit:
        values["edges"] = None  # --syn-avg-degree sets the edges again
    values["split"] = tuple(values["split"])
    return SyntheticConfig(**values)


def config_from_args(args: argparse.Namespace, explicit: set[str] = frozenset()) -> PrepConfig:
    """``explicit``: the destinations given on the command line (they override a preset)."""
    return dataclass_from_namespace(
        PrepConfig, args, partition=dataclass_from_namespace(PartitionConfig, args),
        synthetic=synthetic_from_args(args, set(explicit)))


def format_summary(result: PrepResult) -> str:
    """What was written: sizes per client, class histograms, cross-client edges, time, memory."""
    m = result.manifest
    lines = [
        f"wrote {m['num_clients']} shards to {result.out}",
        f"dataset {m['dataset']}: {m['num_nodes']:,} nodes, {m['num_edges']:,} undirected edges, "
        f"{m['num_features']} features, {m['num_classes']} classes; split {m['split_rule']} "
        f"(train/val/test {m['num_train']:,}/{m['num_val']:,}/{m['num_test']:,})",
        *([EdgeCleaning(**m["source"]["edge_cleaning"]).describe()]
          if "edge_cleaning" in m["source"] else []),
        f"partition {m['partition']} seed {m['seed']}"
        + (f" {m['partition_params']}" if m["partition_params"] else ""),
        f"{'client':>6} {'nodes':>10} {'inner edges':>12} {'cross edges':>12} "
        f"{'train':>8} {'val':>7} {'test':>8}  class histogram",
    ]
    for c in m["clients"]:
        lines.append(f"{c['client_id']:>6} {c['num_nodes']:>10,} {c['num_inner_edges']:>12,} "
                     f"{c['num_cross_edges']:>12,} {c['num_train']:>8,} {c['num_val']:>7,} "
                     f"{c['num_test']:>8,}  {' '.join(str(k) for k in c['class_counts'])}")
    sizes = [c["num_nodes"] for c in m["clients"]]
    lines.append(f"client sizes: {min(sizes):,} to {max(sizes):,} nodes (largest / mean "
                 f"{max(sizes) * len(sizes) / sum(sizes):.2f}); partitioned in "
                 f"{result.partition_seconds:.1f} s")
    lines.append(f"cross-client edges: {m['num_cross_edges']:,} of {m['num_edges']:,} "
                 f"({100 * m['cross_edge_fraction']:.2f}%; random partition expects "
                 f"{100 * (1 - 1 / m['num_clients']):.2f}%)")
    lines.append(f"time {result.seconds:.1f} s, peak RSS {result.peak_rss_mb:,.0f} MB")
    return "\n".join(lines)


def _prepare(argv: list[str]) -> int:
    parser = build_parser()
    explicit = explicit_dests(parser, argv)
    config = config_from_args(parser.parse_args(argv), explicit)
    config.partition.check_knobs_given(explicit)
    result = run_prep(config)
    if config.show_progress:
        print(format_summary(result))
    return 0


@dataclass(frozen=True)
class VerifyArgs:
    """The command line of ``data_prep verify``."""

    shard_dir: Path = option(MISSING, "shard directory written by data_prep", positional=True)
    show_progress: bool = option(True, "no progress lines on stderr", flag="--quiet")


def _verify(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} verify",
                                     description="Check a shard directory; report every problem.")
    add_dataclass_arguments(parser, VerifyArgs)
    args = dataclass_from_namespace(VerifyArgs, parser.parse_args(argv))
    report = verify_shard_dir(args.shard_dir, show_progress=args.show_progress)
    if report.ok:
        m = report.manifest or {}
        print(f"{PROG} verify: {args.shard_dir} OK ({m.get('num_clients')} clients, "
              f"{m.get('num_nodes')} nodes, {m.get('num_edges')} edges)")
        return 0
    for problem in report.problems:
        print(f"{PROG} verify: problem: {problem}")
    print(f"{PROG} verify: {len(report.problems)} problem(s) in {args.shard_dir}")
    return 1


@dataclass(frozen=True)
class AssignmentArgs:
    """The command line of ``data_prep assignment``."""

    shard_dir: Path = option(MISSING, "shard directory written by data_prep", positional=True)
    out: Path = option(MISSING, "file to write: .npy, else text with one client id per line",
                       positional=True)


def _assignment(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} assignment",
        description="Write the client of every node of a shard directory (node order), the "
                    "input of --partition file:PATH.")
    add_dataclass_arguments(parser, AssignmentArgs)
    args = dataclass_from_namespace(AssignmentArgs, parser.parse_args(argv))
    assignment = read_assignment(args.shard_dir)
    if args.out.exists():
        raise FileExistsError(f"{args.out} already exists; remove it or choose another name")
    if args.out.suffix.lower() == ".npy":
        np.save(args.out, assignment)
    else:
        args.out.write_text("".join(f"{c}\n" for c in assignment.tolist()))
    print(f"{PROG} assignment: {assignment.shape[0]} nodes of {args.shard_dir} to {args.out}")
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so SIGTERM (e.g. a job scheduler) cleans up like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not in the main thread (e.g. called from a test runner thread)
        previous = None
    try:
        if argv[:1] == ["verify"]:
            return _verify(argv[1:])
        if argv[:1] == ["assignment"]:
            return _assignment(argv[1:])
        return _prepare(argv)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; partial output removed, existing shards untouched",
              file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if is_disk_full(exc) and not isinstance(exc, DiskFullError):  # a write we do not wrap
            exc = disk_full_error(getattr(exc, "filename", None) or "?", exc.errno, None)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
