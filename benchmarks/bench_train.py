"""Training cost on amazon-computers with 8 clients: ours, ours-full and centralized.

    . .venv/bin/activate
    python benchmarks/bench_train.py [--epochs 20] [--work /tmp/mpifgl-bench] [--shards DIR]
        [--methods ours,centralized,...] [--repeats R]

Methods: ours (label-guided sampling, s = n/4 draws per step, its default ceil(n/s) = 4 steps
per epoch), ours-1step (one such step per epoch), ours-star (ours with --exchange star: terms
gathered at the server instead of MPI_Reduce), ours-full (no sampling), centralized (one process,
one torch thread: the reference of the issue's speed targets), centralized-all-cores (the same
with one torch thread per core: the whole machine, as the 9 MPI ranks have it).
Prints, per method: seconds per epoch (training compute and communication apart, max over ranks,
mean over the steady epochs 2..E-1) and the bytes each client moves per epoch, next to the
paper's communication volume (appendix C): the forward pass moves m * n_S * L * d elements per
step, the backward pass the same again, the weight-gradient sum m * L * d^2 more.

Which counter is which: every client rank counts the bytes it passes to MPI (bytes_sent) and gets
back (bytes_received). With ``--exchange reduce`` one exchange has each client contribute its
[n_S, d_l] buffer of terms to a Reduce at the server (bytes_sent += n_S * d_l * 4) and receive
its own [n_S_i, d_l] segment of the sum by Scatterv, so the SUM over clients of bytes_sent for
the exchanges is exactly the paper's m * n_S * d per layer and direction, with d_l the layer's
output width (here 128, then 10 classes) instead of one d for every layer; the default
``compact`` exchange sends only the non-zero rows (benchmarks/bench_exchange_bytes.py). The
counters also hold the gradient sum (float64 values of every parameter) and the sample index
allgather. Evaluation is switched off in the measured epochs (--eval-every larger than the run),
so the figures are training only. Asserts nothing.

``--repeats R`` runs the methods R times, in interleaved rounds (ours, ..., centralized, then
again), and prints every round's ratio and the median: this virtual machine's speed drifts by up
to 30% within the hour, so only runs made close together compare.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from fgl_common.launch import mpirun_path  # noqa: E402
from study.runner import prepare_shards_subprocess, subprocess_env  # noqa: E402
from study.rundir import read_metrics  # noqa: E402

CLIENTS = 8
METHODS = ("ours", "ours-1step", "ours-star", "ours-full", "centralized", "centralized-all-cores")
HIDDEN = 128
LAYERS = 2


@dataclass(frozen=True)
class TrainBenchArgs:
    epochs: int = option(20, "epochs per run")
    work: Path = option(Path("/tmp/mpifgl-bench"), "shards and runs go here")
    shards: Path | None = option(None, "existing amazon-computers 8-client shards (default: "
                                       "prepared)")
    data_root: str | None = option(None, "raw datasets directory (data_prep's --data-root)")
    methods: tuple[str, ...] = option(METHODS, "comma-separated subset of: " + ", ".join(METHODS),
                                      METHODS)
    repeats: int = option(1, "interleaved rounds")


def run(method: str, shards: Path, out: Path, epochs: int, flags: list[str]) -> float:
    command = [sys.executable, "-m", "mpifgl.train", "--shards", str(shards), "--out", str(out),
               "--epochs", str(epochs), "--eval-every", str(10 * epochs), "--force", *flags]
    env = subprocess_env()  # one torch thread per process
    if not method.startswith("centralized"):
        command = [mpirun_path(), "-n", str(CLIENTS + 1), *command]
    elif method == "centralized-all-cores":
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                            cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{method} failed ({result.returncode}): {result.stderr[-2000:]}")
    return time.perf_counter() - start


def steady(out: Path) -> list[dict]:
    records = read_metrics(out)
    return records[1:-1] if len(records) > 2 else records  # drop warm-up and evaluated epoch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, TrainBenchArgs)
    args = dataclass_from_namespace(TrainBenchArgs, parser.parse_args())
    chosen = list(args.methods)
    if not chosen:
        parser.error(f"--methods is empty, expected a comma-separated subset of "
                     f"{', '.join(METHODS)}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected at least 1")
    shards = args.shards or args.work / "shards" / "amazon-computers-random-m8-s0"
    if args.shards is None:
        prepare_shards_subprocess("amazon-computers", CLIENTS, "random", args.data_root, shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    n, classes = manifest["num_nodes"], manifest["num_classes"]
    sample = round(n / 4)
    print(f"amazon-computers: n = {n}, {classes} classes, {manifest['num_features']} features, "
          f"{CLIENTS} clients, cross-client edges {100 * manifest['cross_edge_fraction']:.2f}%; "
          f"{args.epochs} epochs, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    methods = {"ours": ["--algo", "ours", "--sample-size", str(sample)],
               "ours-1step": ["--algo", "ours", "--sample-size", str(sample),
                              "--steps-per-epoch", "1"],
               "ours-star": ["--algo", "ours", "--sample-size", str(sample), "--exchange", "star"],
               "ours-full": ["--algo", "ours", "--sampling", "none"],
               "centralized": ["--algo", "centralized"],
               "centralized-all-cores": ["--algo", "centralized"]}
    print(f"\n{'method':22s} {'steps':>5s} {'wall s':>7s} {'epoch s':>8s} {'compute s':>9s} {'comm s':>7s} "
          f"{'MB sent/client':>14s} {'MB recv/client':>14s} {'peak RSS/client MB':>18s}")
    measured, rounds = {}, [dict() for _ in range(args.repeats)]
    for round_index, method in ((r, m) for r in range(args.repeats) for m in chosen):
        flags = methods[method]
        out = args.work / "runs" / method
        wall = run(method, shards, out, args.epochs, flags)
        records = steady(out)
        mean = lambda key: sum(r[key] for r in records) / len(records)  # noqa: E731
        sent = [sum(r["bytes_sent"][1:]) / max(1, len(r["bytes_sent"]) - 1) for r in records]
        received = [sum(r["bytes_received"][1:]) / max(1, len(r["bytes_received"]) - 1)
                    for r in records]
        rss = max(max(r["peak_rss_mb"][1:] or r["peak_rss_mb"]) for r in records)
        steps = json.loads((out / "config.json").read_text())["steps_per_epoch"]
        measured[method] = (sum(sent) / len(sent), steps)
        rounds[round_index][method] = mean("epoch_seconds")
        label = method if args.repeats == 1 else f"{method} #{round_index + 1}"
        print(f"{label:22s} {steps:5d} {wall:7.1f} {mean('epoch_seconds'):8.3f} {mean('compute_seconds'):9.3f}"
              f" {mean('comm_seconds'):7.3f} {sum(sent) / len(sent) / 2**20:14.2f} "
              f"{sum(received) / len(received) / 2**20:14.2f} {rss:18.0f}")
    references = [m for m in ("centralized", "centralized-all-cores") if m in chosen]
    if references:
        print("\nepoch time / centralized epoch time, each round against its own centralized runs "
              "(the targets: ours <= 1, ours-full <= 2):")
    for method in chosen:
        for reference in references:
            ratios = [r[method] / r[reference] for r in rounds]
            each = "" if args.repeats == 1 else "  (rounds: " + ", ".join(f"{x:.2f}" for x in ratios) + ")"
            print(f"  {method:22s} {median(ratios):5.2f} x {reference}{' (1 thread)' if reference == 'centralized' else ''}"
                  f"{' median' if args.repeats > 1 else ''}{each}")
    print("\nbytes per epoch against the paper's formula (4-byte elements, per step x steps):")
    widths = [HIDDEN] * (LAYERS - 1) + [classes]
    for method, n_s in (("ours", sample), ("ours-full", n)):
        if method not in measured:
            continue
        sent, steps = measured[method]
        paper = CLIENTS * n_s * LAYERS * HIDDEN
        ours_model = CLIENTS * n_s * sum(widths)
        mb = lambda elements: elements * 4 * steps / 2**20  # noqa: E731
        print(f"  {method:10s} n_S = {n_s:6d}, {steps} step(s): paper forward m*n_S*L*d = "
              f"{paper:,} elements per step ({mb(paper):.1f} MB per epoch; x2 with backward = "
              f"{2 * mb(paper):.1f} MB); with our widths d_l = {widths}: {ours_model:,} elements "
              f"per step ({mb(ours_model):.1f} MB, x2 = {2 * mb(ours_model):.1f} MB); measured "
              f"sum of clients' bytes_sent = {sent * CLIENTS / 2**20:.1f} MB per epoch")
    print("  (n_S for ours = draws s = n/4, an upper bound on the distinct sampled rows that "
          "travel; measured also holds the float64 gradient sum and the index allgather)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
