"""What ``--threads auto`` buys over ``--threads 1`` for one process, against the machine's own
ceiling.

    . .venv/bin/activate
    python benchmarks/bench_threads.py --shards shards/computers-8 [--rounds 5] [--epochs 40]

First the ceiling: torch's sgemm (4096 x 4096) and a first layer's two products on
amazon-computers' shapes (X W and X^T G, 13,752 x 767 x 128), on one thread and on all the cores
this process may use, alternately. Then ``--rounds`` interleaved rounds of centralized full-batch
training (``python -m mpifgl.train --algo centralized``) with ``--threads 1`` and ``--threads
auto``: the training seconds per epoch each run prints, and the speed-up per round and its
median. Run it on an otherwise idle machine: timings drift between invocations, so only the
ratios within one invocation compare. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TRAINING = re.compile(r"training ([0-9.]+) s per epoch")


def seconds(work, repeats: int) -> float:
    work()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - start) / repeats


def ceiling(cores: int, rounds: int) -> None:
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    x, w, g = torch.randn(13_752, 767), torch.randn(767, 128), torch.randn(13_752, 128)
    cases = {"sgemm 4096^3": (lambda: a @ b, 3),
             "X W + X^T G (13,752 x 767 x 128)": (lambda: (x @ w, x.t() @ g), 20)}
    for name, (work, repeats) in cases.items():
        ratios = []
        for _ in range(rounds):
            timed = {}
            for threads in (1, cores):
                torch.set_num_threads(threads)
                timed[threads] = seconds(work, repeats)
            ratios.append(timed[1] / timed[cores])
        print(f"{name}: {cores} threads / 1 thread speed-up per round "
              f"{', '.join(f'{r:.2f}x' for r in ratios)}; median {statistics.median(ratios):.2f}x",
              flush=True)


def training_seconds(shards: Path, threads: str, epochs: int, out: Path) -> float:
    command = [sys.executable, "-m", "mpifgl.train", "--algo", "centralized", "--shards",
               str(shards), "--epochs", str(epochs), "--eval-every", str(epochs), "--log-every",
               str(epochs), "--threads", threads, "--out", str(out), "--force"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    return float(TRAINING.search(done.stdout + done.stderr).group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=Path, required=True, help="a shard directory")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--epochs", type=int, default=40, help="epochs per training run")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    ceiling(cores, args.rounds)
    ratios = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(1, args.rounds + 1):
            one = training_seconds(args.shards, "1", args.epochs, Path(scratch) / "one")
            auto = training_seconds(args.shards, "auto", args.epochs, Path(scratch) / "auto")
            ratios.append(one / auto)
            print(f"round {round_}: --threads 1 {one:.3f} s/epoch, --threads auto {auto:.3f} "
                  f"s/epoch, speed-up {one / auto:.2f}x", flush=True)
    print(f"training: --threads auto / --threads 1 speed-up median "
          f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x) over "
          f"{args.rounds} rounds on {cores} cores")


if __name__ == "__main__":
    main()
