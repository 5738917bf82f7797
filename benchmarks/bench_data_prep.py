"""Benchmark of data_prep (a measurement, not a test).

    . .venv/bin/activate
    python benchmarks/bench_data_prep.py                     # both cases below
    python benchmarks/bench_data_prep.py --case amazon-computers
    python benchmarks/bench_data_prep.py --case products-synthetic --out-dir /tmp/bench

Cases (8 clients, random partition, seed 0):
  amazon-computers    the real Amazon Computers graph from the data root
  products-synthetic  synthetic graph of ogbn-products size: 2,449,029 nodes, 61,859,140
                      undirected edges (average degree 50.5), 100 features, 47 classes
                      (target: < 15 minutes, < 12 GB peak RSS)

Each case runs ``python -m data_prep`` in a child process (which also verifies what it wrote) and
then ``python -m data_prep verify`` on the result; the wall time and the peak RSS of each child
(ru_maxrss from os.wait4, so per child) are printed. Output directories are deleted afterwards
unless --keep is given."""
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

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402

CASES = {
    "amazon-computers": ["--dataset", "amazon-computers"],
    "products-synthetic": ["--dataset", "synthetic", "--syn-nodes", "2449029",
                           "--syn-edges", "61859140", "--syn-features", "100",
                           "--syn-classes", "47", "--syn-homophily", "0.8"],
}


@dataclass(frozen=True)
class DataPrepBenchArgs:
    case: str = option("all", "which case to measure", (*CASES, "all"))
    num_clients: int = option(8, "clients of the random partition")
    out_dir: Path | None = option(None, "where shard directories go (default: a temp dir)")
    keep: bool = option(False, "keep the shard directories")


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
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="bench-data-prep-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = list(CASES) if args.case == "all" else [args.case]
    failed = False
    for case in cases:
        out = out_dir / f"{case}-{args.num_clients}"
        prep = [sys.executable, "-m", "data_prep", *CASES[case], "--num-clients",
                str(args.num_clients), "--partition", "random", "--seed", "0", "--out", str(out),
                "--force"]
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
