"""Ours and centralized full batch on each device and thread setting, in one invocation, on the
products-size hard synthetic graph of docs/scale.md.

    . .venv/bin/activate
    python benchmarks/bench_devices.py --work /tmp/mpifgl-devices \
        [--scale 1.0] [--clients 8] [--epochs 3] [--cases ours-cuda,ours-cpu-auto,...]

Cases (``--cases``, in this order; a CUDA case is recorded as skipped where torch sees no GPU):

  ours-cuda              mpirun -n M+1 ... --device cuda (the clients share the node's GPUs)
  ours-cpu-auto          ... --device cpu --threads auto
  ours-cpu-1             ... --device cpu --threads 1
  centralized-cuda       --algo centralized --device cuda
  centralized-cpu-auto   --algo centralized --device cpu --threads auto
  centralized-cpu-1      --algo centralized --device cpu --threads 1
  ours-paper-cuda        ours at the paper's products settings: 3 layers, the paper's sample
                         fraction (500,000 of 2,449,029 nodes, scaled), --device cuda
  ours-cpu-auto-quarter  ours-cpu-auto with the sample of graphs up to 20,000 nodes: 4 steps
                         of ceil(n/4) draws (above, the default is one step of n draws)
  ours-cpu-auto-history  ours-cpu-auto (the large-graph default) with --history-every 5
  ours-cpu-auto-paper    ours-cpu-auto with the paper's sample fraction (eq. 4, 5 steps)
  ours-cpu-auto-paper-history
                         ours-cpu-auto-paper with --history-every 5

``--layers`` applies to every case (2: the graph of docs/scale.md; 3: the paper's products
depth); ours-paper-cuda always runs 3.

Each runs ``--epochs`` epochs with one full-graph evaluation at the end. Printed per case, as
benchmarks/bench_products.py prints them (training seconds per epoch, bytes per client, peak
RSS, test F1, wall time), plus each rank's peak GPU memory (torch.cuda.max_memory_allocated,
metrics.jsonl's peak_gpu_mb) and the speed-ups: ours on CUDA against ours on the CPU with
--threads auto, and --threads auto against --threads 1. Results go to --work/results.json.
Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_products import (PRODUCTS_NODES, Outcome, prepare,  # noqa: E402
                                       run_command, synthetic_options, table)
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from study import rundir  # noqa: E402

PAPER_SAMPLE = 500_000  # the paper's products sample size, of PRODUCTS_NODES nodes
CENTRALIZED = ["--algo", "centralized"]
# case -> (distributed, flags)
CASES = {
    "ours-cuda": (True, ["--device", "cuda"]),
    "ours-cpu-auto": (True, ["--device", "cpu", "--threads", "auto"]),
    "ours-cpu-1": (True, ["--device", "cpu", "--threads", "1"]),
    "centralized-cuda": (False, CENTRALIZED + ["--device", "cuda"]),
    "centralized-cpu-auto": (False, CENTRALIZED + ["--device", "cpu", "--threads", "auto"]),
    "centralized-cpu-1": (False, CENTRALIZED + ["--device", "cpu", "--threads", "1"]),
    "ours-paper-cuda": (True, ["--device", "cuda", "--layers", "3"]),  # + the paper's sample
    # the default sample of graphs up to 20,000 nodes, 4 steps of ceil(n/4): the earlier figures
    "ours-cpu-auto-quarter": (True, ["--device", "cpu", "--threads", "auto",
                                     "--steps-per-epoch", "4"]),  # + --sample-size ceil(n/4)
    # what the history option costs at scale, beside the default and the paper's sample
    "ours-cpu-auto-history": (True, ["--device", "cpu", "--threads", "auto",
                                     "--history-every", "5"]),
    "ours-cpu-auto-paper": (True, ["--device", "cpu", "--threads", "auto"]),  # + paper sample
    "ours-cpu-auto-paper-history": (True, ["--device", "cpu", "--threads", "auto",
                                           "--history-every", "5"]),  # + the paper's sample
}
PAPER_SAMPLE_CASES = ("ours-paper-cuda", "ours-cpu-auto-paper", "ours-cpu-auto-paper-history")


@dataclass(frozen=True)
class DevicesBenchArgs:
    work: Path = option(Path("/tmp/mpifgl-devices"), "shards, runs and results.json go here")
    scale: float = option(1.0, "fraction of ogbn-products' nodes and edges")
    clients: int = option(8, "clients of the distributed cases")
    epochs: int = option(3, "epochs per run; the last one evaluates on the full graph")
    layers: int = option(2, "GCN layers of every case but ours-paper-cuda (3: the paper's)")
    cases: tuple[str, ...] = option(tuple(CASES), "comma-separated subset of "
                                    + ", ".join(CASES), tuple(CASES))
    timeout: float = option(3600.0, "seconds after which a run is killed and recorded as failed")


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def case_flags(case: str, scale: float) -> list[str]:
    flags = list(CASES[case][1])
    if case in PAPER_SAMPLE_CASES:
        flags += ["--sample-size", str(max(1, round(PAPER_SAMPLE * scale)))]
    if case == "ours-cpu-auto-quarter":
        flags += ["--sample-size", str(max(1, -(-round(PRODUCTS_NODES * scale) // 4)))]
    return flags


def peak_gpu(out: Path) -> list[float] | None:
    """Each rank's peak GPU MB of the last recorded epoch (None without a GPU)."""
    records = rundir.read_metrics(out)
    return records[-1].get("peak_gpu_mb") if records else None


def speedups(outcomes: dict[str, Outcome]) -> list[str]:
    def epoch(name: str) -> float | None:
        o = outcomes.get(name)
        return o.steady_train_seconds if o is not None and o.status == "done" else None

    lines = []
    for faster, slower, what in (("ours-cuda", "ours-cpu-auto", "ours: CUDA / CPU --threads auto"),
                                 ("ours-cpu-auto", "ours-cpu-1", "ours: --threads auto / 1"),
                                 ("centralized-cuda", "centralized-cpu-auto",
                                  "centralized: CUDA / CPU --threads auto"),
                                 ("centralized-cpu-auto", "centralized-cpu-1",
                                  "centralized: --threads auto / 1"),
                                 ("ours-cuda", "centralized-cuda", "CUDA: ours / centralized")):
        a, b = epoch(faster), epoch(slower)
        if a and b:
            lines.append(f"  {what:42} {b / a:6.2f}x faster ({a:.3f} s against {b:.3f} s "
                         "per training epoch)")
    # (case, reference): the case's epoch as a multiple of the reference's
    ratios = [(ours, central) for ours in ("ours-cpu-auto", "ours-cpu-auto-quarter", "ours-cpu-1")
              for central in ("centralized-cpu-1", "centralized-cpu-auto")]
    ratios += [("ours-cpu-auto-history", "ours-cpu-auto"),
               ("ours-cpu-auto-paper-history", "ours-cpu-auto-paper"),
               ("ours-cpu-auto-paper-history", "ours-cpu-auto")]
    for case, reference in ratios:
        a, b = epoch(case), epoch(reference)
        if a and b:
            lines.append(f"  {case + ' / ' + reference:52} {a / b:6.2f}x the epoch ({a:.3f} s "
                         f"against {b:.3f} s)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, DevicesBenchArgs)
    args = dataclass_from_namespace(DevicesBenchArgs, parser.parse_args())
    if not 0 < args.scale <= 1 or args.epochs < 1 or args.clients < 1 or args.layers < 1:
        parser.error(f"--scale in (0, 1], --epochs, --clients and --layers >= 1 expected, got "
                     f"{args.scale}, {args.epochs}, {args.clients}, {args.layers}")
    args.work.mkdir(parents=True, exist_ok=True)
    gpu = cuda_available()
    print(f"synthetic products x{args.scale:g} ({round(PRODUCTS_NODES * args.scale):,} nodes): "
          f"{synthetic_options(args.scale)}; CUDA {'available' if gpu else 'not available'}",
          flush=True)
    shards = prepare(args.work, args.clients, args.scale)
    outcomes: dict[str, Outcome] = {}
    gpu_memory: dict[str, list[float] | None] = {}
    for case in args.cases:
        distributed, _ = CASES[case]
        if "cuda" in case and not gpu:
            outcomes[case] = Outcome(case, args.clients, status="skipped (no CUDA device)")
            continue
        out = args.work / "runs" / case
        command = [sys.executable, "-m", "mpifgl.train", "--shards", str(shards), "--out",
                   str(out), "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
                   "--force", "--layers", str(args.layers), *case_flags(case, args.scale)]
        outcome = run_command(case, args.clients, command, out, distributed, args.timeout)
        outcomes[case] = outcome
        gpu_memory[case] = peak_gpu(out)
    ran = list(outcomes.values())
    print(f"\nproducts x{args.scale:g}, {args.clients} clients, {args.layers} layers, "
          f"{args.epochs} epochs (evaluation at the last); MB per epoch, 'mean / max' over "
          "clients\n")
    print(table(ran))
    print("\npeak GPU MB per rank (torch.cuda.max_memory_allocated):")
    for case, memory in gpu_memory.items():
        if memory:
            print(f"  {case:22} max {max(memory):,.0f}  sum {sum(memory):,.0f}  "
                  f"({', '.join(f'{m:,.0f}' for m in memory)})")
    print("\nspeed-ups, mean training epoch (epochs 2..E):")
    print("\n".join(speedups(outcomes)) or "  n/a")
    results = {"scale": args.scale, "clients": args.clients, "epochs": args.epochs,
               "layers": args.layers,
               "synthetic": synthetic_options(args.scale),
               "runs": {case: {**asdict(o), "peak_gpu_mb": gpu_memory.get(case)}
                        for case, o in outcomes.items()}}
    (args.work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nresults: {args.work / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
