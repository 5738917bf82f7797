"""What the watchdog costs: the two marks of every collective, and whole epochs with and without
its monitor thread.

    . .venv/bin/activate
    python benchmarks/bench_watchdog.py [--shards DIR] [--epochs 30] [--repeats 5]
        [--calls 100000] [--baseline-repo DIR] [--work /tmp/mpifgl-bench-watchdog]

1. Per collective, in this process (a world of one rank): ``--calls`` one-element Ibcast + Wait
   through ``MPICommunicator._timed`` (the watchdog's enter and leave around the wait) against
   the same loop without the marks, in ``--repeats`` interleaved rounds; prints microseconds per
   call of each and their difference.
2. Per epoch: ``mpirun -n 3`` of a small run (cora, 2 clients, hidden 16, the default sampling,
   evaluation off) with ``--watchdog-seconds 0`` (no monitor thread), auto (the default) and 1
   (the ranks ask each other whenever a wait passes a second), in interleaved rounds; with
   ``--baseline-repo`` also that checkout's code (e.g. a tree from before the watchdog) with
   its defaults. Prints each run's mean training seconds per epoch (final.json) and the median
   per variant. Asserts nothing; on a shared machine only rounds made close together compare.
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

CLIENTS = 2
VARIANTS = {"off": ["--watchdog-seconds", "0"], "auto": [], "1 s": ["--watchdog-seconds", "1"]}


@dataclass(frozen=True)
class WatchdogBenchArgs:
    epochs: int = option(30, "epochs per run")
    repeats: int = option(5, "interleaved rounds")
    calls: int = option(100000, "collectives per round of the per-call measurement (0: skip it)")
    shards: Path | None = option(None, "existing cora shards of 2 clients (default: prepared)")
    data_root: str | None = option(None, "raw datasets directory (data_prep's --data-root)")
    baseline_repo: Path | None = option(None, "another checkout to run as the variant "
                                              "'baseline' with its own defaults")
    work: Path = option(Path("/tmp/mpifgl-bench-watchdog"), "shards and runs go here")


def per_call(calls: int, repeats: int) -> None:
    import torch
    from mpifgl.comm import MPI_TYPES, world
    comm = world()
    target = [torch.zeros(1, dtype=torch.int64).numpy(), MPI_TYPES[torch.int64]]

    def unmarked(start_collective, *args) -> None:  # _timed as it was before the watchdog
        start = time.perf_counter()
        try:
            start_collective(*args).Wait()
        finally:
            comm.seconds += time.perf_counter() - start

    times: dict[str, list[float]] = {"unmarked": [], "marked": []}
    for _ in range(repeats):
        for name, call in (("unmarked", unmarked), ("marked", comm._timed)):
            start = time.perf_counter()
            for _ in range(calls):
                call(comm.comm.Ibcast, target, 0)
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    print(f"per collective ({calls} one-element Ibcast + Wait, world of one rank, {repeats} "
          f"rounds): " + ", ".join(f"{name} {median(t):.3f} us (rounds: "
                                   f"{', '.join(f'{x:.3f}' for x in t)})"
                                   for name, t in times.items())
          + f"; the marks add {median(times['marked']) - median(times['unmarked']):.3f} us")


def epoch_seconds(repo: Path, shards: Path, out: Path, epochs: int, flags: list[str]) -> float:
    command = [mpirun_path(), "-n", str(CLIENTS + 1), sys.executable, "-m", "mpifgl.train",
               "--shards", str(shards), "--out", str(out), "--epochs", str(epochs),
               "--eval-every", str(10 * epochs), "--hidden", "16", "--force", *flags]
    env = subprocess_env()
    env["PYTHONPATH"] = str(repo) + os.pathsep + env["PYTHONPATH"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                            cwd=repo)
    if result.returncode != 0:
        raise SystemExit(f"{out.name} failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads((out / "final.json").read_text())["mean_train_epoch_seconds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, WatchdogBenchArgs)
    args = dataclass_from_namespace(WatchdogBenchArgs, parser.parse_args())
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected at least 1")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    if args.calls:
        per_call(args.calls, args.repeats)
    shards = args.shards or args.work / "shards" / "cora-random-m2-s0"
    if args.shards is None and not (shards / "manifest.json").is_file():
        prepare_shards_subprocess("cora", CLIENTS, "random", args.data_root, shards)
    variants = {name: (REPO, flags) for name, flags in VARIANTS.items()}
    if args.baseline_repo is not None:
        variants["baseline"] = (args.baseline_repo.resolve(), [])
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    print(f"\nmean training seconds per epoch, cora, {CLIENTS} clients, {args.epochs} epochs:")
    for round_index in range(args.repeats):
        for name, (repo, flags) in variants.items():
            value = epoch_seconds(repo, shards, args.work / "runs" / name.replace(" ", ""),
                                  args.epochs, flags)
            seconds[name].append(value)
            print(f"  round {round_index + 1} {name:9s} {value:.4f} s", flush=True)
    for name, values in seconds.items():
        print(f"{name:9s} median {median(values):.4f} s (min {min(values):.4f}, max "
              f"{max(values):.4f}) over {len(values)} runs")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
