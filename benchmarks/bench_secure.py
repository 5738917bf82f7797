"""Cost of --secure: the masked compact exchange against the same exchange without masking,
interleaved in one invocation (issue 14 measures amazon-computers with 8 clients).

    . .venv/bin/activate
    python -m data_prep --dataset amazon-computers --num-clients 8 \\
        --data-root /work/shared/data --out /tmp/ac8          # once
    python benchmarks/bench_secure.py --shards /tmp/ac8 [--epochs 30] [--repeats 3] \\
        [--dtype float32] [--eval-every K] [--work /tmp/mpifgl-bench-secure]

Each round runs ``plain`` (``--exchange compact``) then ``secure`` (the same with --secure), the
default label-guided sampling (s = n/4, 4 steps per epoch), hidden 128, 2 layers, no evaluation
in the measured epochs unless --eval-every K. Prints per run: seconds per epoch (max over
ranks, mean of the steady epochs 2..E-1), compute and communication seconds, bytes sent and
received per client per epoch (every collective: exchange terms and ids, gradient sum, sample
allgather, and with --secure the key set-up's share is in epoch 1 only, which is dropped), the
exchange's own bytes, and a client's wall time per step outside MPI waits (compute plus the
masking; with more ranks than cores it also holds the time other ranks had the core), and the
masked operations redone (--secure: a term outgrew its lagged range); then secure / plain per
round and the median, with the bytes a client sends over the whole run (every epoch, the first
and evaluation included). Any number of clients: the world is the shards' M + 1
ranks. Targets: epoch <= 1.3x, bytes <= 1.02x for float32 runs. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from fgl_common.launch import mpirun_path  # noqa: E402
from study.runner import subprocess_env  # noqa: E402
from study.rundir import read_metrics  # noqa: E402

METHODS = {"plain": [], "secure": ["--secure"]}
STEPS_PER_EPOCH = 4  # the default s = ceil(n/4)


@dataclass(frozen=True)
class SecureBenchArgs:
    shards: Path = option(None, "shard directory (python -m data_prep ...; issue 14: "
                                "amazon-computers, 8 clients)", required=True)
    # 28 measured epochs: a run's mean then drifts less with the machine's speed than over 8
    epochs: int = option(30, "epochs per run (the first and last are not measured)")
    repeats: int = option(3, "interleaved rounds of plain then secure")
    dtype: str = option("float32", "floating point type of the runs", ("float32", "float64"))
    eval_every: int = option(0, "evaluate every K epochs (0: only after the last, unmeasured, "
                                "epoch)")
    work: Path = option(Path("/tmp/mpifgl-bench-secure"), "run directories go here")


def run(shards: Path, out: Path, clients: int, epochs: int, dtype: str, eval_every: int,
        flags: list[str]) -> list[dict]:
    """Every epoch's record of one run."""
    command = [mpirun_path(), "-n", str(clients + 1), sys.executable, "-m", "mpifgl.train",
               "--shards", str(shards), "--out", str(out), "--epochs", str(epochs),
               "--eval-every", str(eval_every or 10 * epochs), "--dtype", dtype,
               "--exchange", "compact", "--force", *flags]
    done = subprocess.run(command, env=subprocess_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return read_metrics(out)


def steady(records: list[dict]) -> list[dict]:
    """The measured epochs: not the first (key set-up, first uses) nor the last."""
    return records[1:-1] if len(records) > 2 else records


def per_client(records: list[dict], key: str) -> float:
    """Mean over epochs of the clients' mean of a per-rank counter."""
    return sum(sum(r[key][1:]) / (len(r[key]) - 1) for r in records) / len(records)


def client_ms_outside_mpi_per_step(records: list[dict]) -> float:
    """A client's seconds outside MPI per step (epoch minus its communication), mean over
    clients and epochs, in ms."""
    per_rank = [[e - c for e, c in zip(r["per_rank"]["epoch_seconds"][1:],
                                       r["per_rank"]["comm_seconds"][1:])] for r in records]
    return 1000 * sum(sum(x) / len(x) for x in per_rank) / len(per_rank) / STEPS_PER_EPOCH


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, SecureBenchArgs)
    args = dataclass_from_namespace(SecureBenchArgs, parser.parse_args())
    if args.eval_every < 0:
        parser.error(f"--eval-every {args.eval_every}: expected 0 (no evaluation) or a positive "
                     "number of epochs")
    manifest_path = args.shards / "manifest.json"
    if not manifest_path.is_file():
        parser.error(f"--shards {args.shards}: no manifest.json; expected a directory written "
                     "by python -m data_prep")
    manifest = json.loads(manifest_path.read_text())
    clients = int(manifest["num_clients"])
    print(f"{manifest['dataset']}: n = {manifest['num_nodes']}, {clients} clients "
          f"({clients + 1} ranks), {args.epochs} epochs x {args.repeats} rounds, {args.dtype}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start\n")
    print(f"{'run':12s} {'epoch s':>8s} {'compute s':>9s} {'comm s':>7s} {'cl ms/step':>14s} "
          f"{'MB sent/cl':>10s} {'MB recv/cl':>10s} {'exch MB sent/cl':>15s} "
          f"{'exch MB recv/cl':>15s} {'redos':>5s}")
    rounds: list[dict[str, dict[str, float]]] = []
    for round_index in range(args.repeats):
        rounds.append({})
        for method, flags in METHODS.items():
            whole = run(args.shards, args.work / method, clients, args.epochs, args.dtype,
                        args.eval_every, flags)
            records = steady(whole)
            figures = {
                       "run_bytes_sent": per_client(whole, "bytes_sent") * len(whole),
                       "redos": sum(r.get("secure_redos", 0) for r in whole),"epoch": sum(r["epoch_seconds"] for r in records) / len(records),
                       "compute": sum(r["compute_seconds"] for r in records) / len(records),
                       "comm": sum(r["comm_seconds"] for r in records) / len(records),
                       "outside": client_ms_outside_mpi_per_step(records),
                       **{key: per_client(records, key) for key in
                          ("bytes_sent", "bytes_received", "exchange_bytes_sent",
                           "exchange_bytes_received")}}
            rounds[-1][method] = figures
            mb = 2 ** 20
            print(f"{method + ' #' + str(round_index + 1):12s} {figures['epoch']:8.3f} "
                  f"{figures['compute']:9.3f} {figures['comm']:7.3f} {figures['outside']:14.1f} "
                  f"{figures['bytes_sent'] / mb:10.3f} {figures['bytes_received'] / mb:10.3f} "
                  f"{figures['exchange_bytes_sent'] / mb:15.3f} "
                  f"{figures['exchange_bytes_received'] / mb:15.3f} {figures['redos']:5d}",
                  flush=True)
    print("\nsecure / plain (per round; median):")
    for key, label in (("epoch", "epoch seconds"), ("outside", "client time outside MPI per step"),
                       ("bytes_sent", "bytes sent per client"),
                       ("bytes_received", "bytes received per client"),
                       ("exchange_bytes_sent", "exchange bytes sent per client"),
                       ("run_bytes_sent", "bytes sent per client, whole run")):
        ratios = [r["secure"][key] / r["plain"][key] for r in rounds]
        print(f"  {label:32s} {median(ratios):6.3f} x  (rounds: "
              + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    # a pairing-free figure: the machine's speed drifts between rounds, so also the ratio of
    # the two methods' median epochs over all rounds
    medians = {m: median(r[m]["epoch"] for r in rounds) for m in METHODS}
    print(f"  {'epoch, median over rounds':32s} {medians['secure'] / medians['plain']:6.3f} x")
    extra = [r["secure"]["outside"] - r["plain"]["outside"] for r in rounds]
    print(f"  masking time per client per step {median(extra):6.1f} ms (median of rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
