"""Benchmark of data_prep (a measurement, not a test).

    . .venv/bin/activate
    python benchmarks/bench_data_prep.py                     # both cases below
    python benchmarks/bench_data_prep.py --case amazon-computers
    python benchmarks/bench_data_prep.py --case products-synthetic --out-dir /tmp/bench
    python benchmarks/bench_data_prep.py --case products-hard --partition louvain --partition-only
    python benchmarks/bench_data_prep.py --case products-hard --partition louvain --partition-only \
        --scale 0.01                                         # the same at 1/100 size
    python benchmarks/bench_data_prep.py --case products-hard --partition louvain --partition-only \
        --features 1                                         # 1 feature: 1 GB less to hold

Cases (8 clients, --partition, default random, seed 0):
  amazon-computers    the real Amazon Computers graph from the data root
  products-synthetic  synthetic graph of ogbn-products size: 2,449,029 nodes, 61,859,140
                      undirected edges (average degree 50.5), 100 features, 47 classes
                      (target: < 15 minutes, < 12 GB peak RSS)
  products-hard       the same size with the hard generator parameters of docs/scale.md
                      (bench_products.HARD_SYNTHETIC: skewed classes and degrees)

Each case runs ``python -m data_prep`` in a child process (which also verifies what it wrote) and
then ``python -m data_prep verify`` on the result; the wall time and the peak RSS of each child
(ru_maxrss from os.wait4, so per child) are printed. Output directories are deleted afterwards
unless --keep is given. With --partition-only the child generates or loads the graph and
partitions it, writing nothing, and prints the seconds of each, the client sizes (smallest,
largest, largest / mean) and the share of cross-client edges; the parent prints its wall time
and peak RSS. --scale multiplies a synthetic case's nodes and edges, --features replaces its
feature width."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_products import HARD_SYNTHETIC, PRODUCTS_EDGES, PRODUCTS_NODES  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402

PRODUCTS_SIZE = ["--dataset", "synthetic", "--syn-nodes", str(PRODUCTS_NODES),
                 "--syn-edges", str(PRODUCTS_EDGES)]
CASES = {
    "amazon-computers": ["--dataset", "amazon-computers"],
    "products-synthetic": [*PRODUCTS_SIZE, "--syn-features", "100", "--syn-classes", "47",
                           "--syn-homophily", "0.8"],
    "products-hard": [*PRODUCTS_SIZE, *(word for key, value in HARD_SYNTHETIC.items()
                                        for word in ("--" + key.replace("_", "-"), str(value)))],
}


@dataclass(frozen=True)
class DataPrepBenchArgs:
    case: str = option("all", "which case to measure", (*CASES, "all"))
    num_clients: int = option(8, "clients of the partition")
    partition: str = option("random", "the --partition of data_prep")
    partition_only: bool = option(False, "load or generate and partition only: no shards")
    scale: float = option(1.0, "multiplies a synthetic case's nodes and edges")
    features: int = option(0, "a synthetic case's --syn-features instead of its own (0: its own; "
                              "a partition reads no feature)")
    out_dir: Path | None = option(None, "where shard directories go (default: a temp dir)")
    keep: bool = option(False, "keep the shard directories")
    in_process: bool = option(False, "(used by --partition-only) measure in this process")


def scaled(argv: list[str], scale: float, features: int = 0) -> list[str]:
    """A case's flags with --syn-nodes and --syn-edges times ``scale`` (and --syn-features
    ``features`` when not 0)."""
    out = list(argv)
    for flag in ("--syn-nodes", "--syn-edges"):
        if flag in out:
            at = out.index(flag) + 1
            out[at] = str(max(1, round(int(out[at]) * scale)))
    if features and "--syn-features" in out:
        out[out.index("--syn-features") + 1] = str(features)
    return out


def partition_only(argv: list[str]) -> None:
    """Load or generate the graph of ``argv`` (data_prep flags) and partition it; print figures."""
    from data_prep.__main__ import build_parser, config_from_args, explicit_dests
    from data_prep.datasets import load_dataset
    from data_prep.partition import cross_edge_fraction, partition_nodes

    parser = build_parser()
    config = config_from_args(parser.parse_args(argv), explicit_dests(parser, argv))
    config.validate()
    start = time.perf_counter()
    graph = load_dataset(config)
    loaded = time.perf_counter() - start
    parts = partition_nodes(graph, config.num_clients, config.partition, config.seed,
                            config.show_progress)
    sizes = parts.sizes()
    print(f"bench: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges loaded in {loaded:.1f} "
          f"s; --partition {config.partition.method} into {config.num_clients} clients in "
          f"{parts.seconds:.1f} s; client sizes {sizes.min():,} to {sizes.max():,} (largest / "
          f"mean {sizes.max() / sizes.mean():.3f}); cross-client edges "
          f"{100 * cross_edge_fraction(graph.adjacency, parts.assignment):.2f}% "
          f"(random: {100 * (1 - 1 / config.num_clients):.2f}%); {parts.params}", flush=True)


def run_child(argv: list[str]) -> tuple[int, float, float]:
    """Run a child process; return (exit status, seconds, peak RSS in MB of that child)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_dataclass_arguments(parser, DataPrepBenchArgs)
    args = dataclass_from_namespace(DataPrepBenchArgs, parser.parse_args())
    cases = list(CASES) if args.case == "all" else [args.case]
    if args.in_process:
        partition_only([*scaled(CASES[args.case], args.scale, args.features), "--num-clients",
                        str(args.num_clients), "--partition", args.partition, "--seed", "0",
                        "--out", "unused"])
        return 0
    if args.partition_only:
        failed = False
        for case in cases:
            child = [sys.executable, __file__, "--case", case, "--num-clients",
                     str(args.num_clients), "--partition", args.partition, "--scale",
                     str(args.scale), "--features", str(args.features), "--in-process"]
            print(f"bench: {case}: {' '.join(child[1:])}", flush=True)
            status, seconds, peak = run_child(child)
            print(f"bench: {case}: load + partition exit {status}, {seconds:.1f} s, peak RSS "
                  f"{peak:,.0f} MB", flush=True)
            failed |= status != 0
        return 1 if failed else 0
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="bench-data-prep-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    for case in cases:
        out = out_dir / f"{case}-{args.num_clients}"
        prep = [sys.executable, "-m", "data_prep",
                *scaled(CASES[case], args.scale, args.features),
                "--num-clients", str(args.num_clients), "--partition", args.partition, "--seed",
                "0", "--out", str(out), "--force"]
        print(f"bench: {case}: {' '.join(prep[1:])}", flush=True)
        status, seconds, peak = run_child(prep)
        print(f"bench: {case}: prepare exit {status}, {seconds:.1f} s, peak RSS {peak:,.0f} MB",
              flush=True)
        failed |= status != 0
        if status == 0:
            status, v_seconds, v_peak = run_child([sys.executable, "-m", "data_prep", "verify",
                                                   str(out)])
            size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
            print(f"bench: {case}: verify exit {status}, {v_seconds:.1f} s, peak RSS "
                  f"{v_peak:,.0f} MB; shard directory {size:,.0f} MB", flush=True)
            failed |= status != 0
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    if args.out_dir is None and not args.keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
