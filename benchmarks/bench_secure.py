"""Cost of --secure on amazon-computers with 8 clients: the masked compact exchange against the
same exchange without masking, interleaved in one invocation.

    . .venv/bin/activate
    python -m data_prep --dataset amazon-computers --num-clients 8 \\
        --data-root /work/shared/data --out /tmp/ac8          # once
    python benchmarks/bench_secure.py --shards /tmp/ac8 [--epochs 10] [--repeats 3] \\
        [--dtype float32] [--work /tmp/mpifgl-bench-secure]

Each round runs ``plain`` (``--exchange compact``) then ``secure`` (the same with --secure), the
default label-guided sampling (s = n/4, 4 steps per epoch), hidden 128, 2 layers, no evaluation
in the measured epochs (--eval-every beyond the run). Prints per run: seconds per epoch (max over
ranks, mean of the steady epochs 2..E-1), compute and communication seconds, bytes sent and
received per client per epoch (every collective: exchange terms and ids, gradient sum, sample
allgather, and with --secure the key set-up's share is in epoch 1 only, which is dropped), the
exchange's own bytes; then secure / plain per round and the median. Targets (issue 14): epoch
<= 1.3x, bytes <= 1.02x for float32 runs. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
CLIENTS = 8
METHODS = {"plain": [], "secure": ["--secure"]}


def mpirun() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def run(shards: Path, out: Path, epochs: int, dtype: str, flags: list[str]) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [mpirun(), "-n", str(CLIENTS + 1), sys.executable, "-m", "mpifgl.train",
               "--shards", str(shards), "--out", str(out), "--epochs", str(epochs),
               "--eval-every", str(10 * epochs), "--dtype", dtype, "--exchange", "compact",
               "--force", *flags]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records[1:-1] if len(records) > 2 else records


def per_client(records: list[dict], key: str) -> float:
    """Mean over epochs of the clients' mean of a per-rank counter."""
    return sum(sum(r[key][1:]) / (len(r[key]) - 1) for r in records) / len(records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=Path, required=True,
                        help="amazon-computers shards with 8 clients (python -m data_prep ...)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/mpifgl-bench-secure"))
    args = parser.parse_args()
    manifest = json.loads((args.shards / "manifest.json").read_text())
    if manifest["num_clients"] != CLIENTS:
        parser.error(f"--shards {args.shards}: {manifest['num_clients']} clients, expected "
                     f"{CLIENTS}")
    print(f"{manifest['dataset']}: n = {manifest['num_nodes']}, {CLIENTS} clients, "
          f"{args.epochs} epochs x {args.repeats} rounds, {args.dtype}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at start\n")
    print(f"{'run':12s} {'epoch s':>8s} {'compute s':>9s} {'comm s':>7s} {'MB sent/cl':>10s} "
          f"{'MB recv/cl':>10s} {'exch MB sent/cl':>15s} {'exch MB recv/cl':>15s}")
    rounds: list[dict[str, dict[str, float]]] = []
    for round_index in range(args.repeats):
        rounds.append({})
        for method, flags in METHODS.items():
            records = run(args.shards, args.work / method, args.epochs, args.dtype, flags)
            figures = {"epoch": sum(r["epoch_seconds"] for r in records) / len(records),
                       "compute": sum(r["compute_seconds"] for r in records) / len(records),
                       "comm": sum(r["comm_seconds"] for r in records) / len(records),
                       **{key: per_client(records, key) for key in
                          ("bytes_sent", "bytes_received", "exchange_bytes_sent",
                           "exchange_bytes_received")}}
            rounds[-1][method] = figures
            mb = 2 ** 20
            print(f"{method + ' #' + str(round_index + 1):12s} {figures['epoch']:8.3f} "
                  f"{figures['compute']:9.3f} {figures['comm']:7.3f} "
                  f"{figures['bytes_sent'] / mb:10.3f} {figures['bytes_received'] / mb:10.3f} "
                  f"{figures['exchange_bytes_sent'] / mb:15.3f} "
                  f"{figures['exchange_bytes_received'] / mb:15.3f}", flush=True)
    print("\nsecure / plain (per round; median):")
    for key, label in (("epoch", "epoch seconds"), ("bytes_sent", "bytes sent per client"),
                       ("bytes_received", "bytes received per client"),
                       ("exchange_bytes_sent", "exchange bytes sent per client")):
        ratios = [r["secure"][key] / r["plain"][key] for r in rounds]
        print(f"  {label:32s} {median(ratios):6.3f} x  (rounds: "
              + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
