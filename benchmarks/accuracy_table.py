"""Accuracy of ours vs centralized GCN with the paper's protocol (a benchmark, not a test).

    python benchmarks/accuracy_table.py --datasets cora,citeseer,amazon-computers,coauthor-cs \
        --out reports/accuracy [--seeds 0,1,2] [--epochs 200] [--clients 8]

8 clients, random partition, hidden 128, dropout 0.2, 200 epochs; lr picked from {0.1, 0.01,
0.001} by best validation micro-F1 on the first seed, then every seed run at that lr; test
micro-F1 at the best validation epoch, mean and std over seeds. Methods (names, flags and labels
from the study's catalog, study/catalog.py): ours (label-guided sampling of a quarter of the
nodes per step, 4 steps per epoch), ours-full (--sampling none), ours-star = ours*
(--no-normalize), centralized GCN. Resumable: a run whose final.json exists is not run again.
Prints a Markdown table and writes it to OUT/accuracy.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.launch import mpi_launch_env, mpirun_path  # noqa: E402
from study.catalog import METHODS, label_of  # noqa: E402
from study.plan import LR_GRID  # noqa: E402

DEFAULT_METHODS = ("ours", "ours-full", "ours-star", "centralized")


def run(method: str, shards: Path, out: Path, lr: float, seed: int, epochs: int,
        clients: int) -> dict:
    if (out / "final.json").is_file():
        return json.loads((out / "final.json").read_text())
    spec = METHODS[method]
    env = mpi_launch_env(one_thread_per_rank=spec.distributed)
    if not spec.distributed:  # one process: let torch use every core
        env.pop("OMP_NUM_THREADS", None)
    args = [sys.executable, "-m", "mpifgl.train", "--shards", str(shards), "--out", str(out),
            "--lr", str(lr), "--seed", str(seed), "--epochs", str(epochs), "--log-every",
            str(epochs), "--force", "--algo", spec.algo, *spec.flags]
    if spec.distributed:
        args = [mpirun_path(), "-n", str(clients + 1), *args]
    start = time.perf_counter()
    subprocess.run(args, env=env, cwd=REPO, check=True, capture_output=True, text=True,
                   timeout=3600)
    final = json.loads((out / "final.json").read_text())
    print(f"  {method:12s} lr {lr:<6} seed {seed}: test {final['test_micro_f1']:.4f} "
          f"(val {final['best_val_micro_f1']:.4f}) in {time.perf_counter() - start:.0f} s",
          flush=True)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--datasets", default="cora,citeseer,amazon-computers,coauthor-cs")
    parser.add_argument("--out", default="reports/accuracy")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="names from study/catalog.py")
    args = parser.parse_args()
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        parser.error(f"--methods {','.join(unknown)}: unknown, expected names of "
                     f"study/catalog.py: {', '.join(METHODS)}")
    from data_prep.api import prepare_shards
    out = Path(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for dataset in args.datasets.split(","):
        shards = out / "shards" / f"{dataset}-{args.clients}"
        prepare_shards(dataset, args.clients, "random", 0, None, shards)
        print(f"{dataset}:", flush=True)
        row = {"dataset": dataset}
        for method in args.methods.split(","):
            runs = out / "runs" / dataset / method
            search = {lr: run(method, shards, runs / f"lr{lr}-s{seeds[0]}", lr, seeds[0],
                              args.epochs, args.clients) for lr in LR_GRID}
            lr = max(LR_GRID, key=lambda v: (search[v]["best_val_micro_f1"], -v))
            scores = [search[lr]["test_micro_f1"]] + [
                run(method, shards, runs / f"lr{lr}-s{s}", lr, s, args.epochs,
                    args.clients)["test_micro_f1"] for s in seeds[1:]]
            std = statistics.stdev(scores) if len(scores) > 1 else 0.0
            row[method] = f"{100 * statistics.mean(scores):.2f} ± {100 * std:.2f} (lr {lr})"
        rows.append(row)
    methods = args.methods.split(",")
    table = ["| dataset | " + " | ".join(label_of(m) for m in methods) + " |", "|---" * (len(methods) + 1) + "|"]
    table += ["| " + r["dataset"] + " | " + " | ".join(r[m] for m in methods) + " |" for r in rows]
    text = (f"Test micro-F1 (%), {args.clients} clients, random partition, {args.epochs} epochs, "
            f"seeds {args.seeds}, lr by validation on seed {seeds[0]}\n\n" + "\n".join(table) + "\n")
    (out / "accuracy.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
