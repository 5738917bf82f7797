"""The paper's time-and-memory table (tab:time cost: the third table of its source, printed as
Table 5 in some versions) in one invocation: CAGNET (1.5D, c = 2, and 1D), FedAvg+GCN and
ours at 4 and 8 clients on the products-size hard synthetic graph, the methods interleaved.

    . .venv/bin/activate
    python benchmarks/bench_time_cost.py --work /tmp/mpifgl-time-cost
        [--scale 1.0] [--clients 4,8] [--methods cagnet,cagnet-1d,fedavg,ours,ours-paper]
        [--epochs 5] [--rounds 1] [--layers 3] [--hidden 128] [--ours-flags ""]
        [--timeout 14400]

``--scale 0.1`` is the quick 1/10 run; 0.01 tries the whole thing in minutes. Shards come from
``benchmarks/bench_products.py``'s ``prepare`` (``HARD_SYNTHETIC``, random partition, reused when
--work holds them). Each round runs every method at every client count once, in an order that
turns by one each round (the machine is noisy: no method always runs first or last); each run is
``mpirun -n M+1 python -m mpifgl.train --algo A`` for --epochs epochs with --layers and --hidden
(the paper's products settings: 3 layers, hidden 128), evaluated at the last epoch only, each
method otherwise at its defaults (ours: its default sampling; ours-paper: the paper's sample
of 500,000 nodes per step, scaled with --scale; --ours-flags adds flags to both). A
failed run (exit status, OOM kill, timeout) is printed as such and the benchmark goes on.

Printed per method and client count (the server rank is left out of every figure but bytes):

  train s/epoch   the median over epochs 2..E of the slowest client's training seconds
                  (compute + communication; evaluation excluded), median over rounds: CAGNET's
                  timing (forward + backward + optimizer step, first epoch untimed)
  tensors MB      a client's tensors as the paper counts memory (final.json rank_reports,
                  mpifgl.tensor_memory): mean and max over clients, and the mean by kind
                  (features, adjacency, activations = what autograd saves, buffers, parameters
                  with Adam's moments)
  peak RSS MB     per_rank peak_rss_mb (ru_maxrss) of the clients: mean and max
  MB/client/ep    bytes sent + received per client per training epoch, mean over clients
  paper           the paper's products column (seconds, MB per client) where it has the row

then each ours row's ratios to CAGNET (c = 2, and 1D) at each client count: training epoch and
mean tensor MB (the paper, against c = 2: 0.13x and 0.12x at 4 clients, 0.12x and 0.12x at 8).
Everything is also written to --work/time_cost.json. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean, median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_devices import PAPER_SAMPLE  # noqa: E402
from benchmarks.bench_products import prepare, run_command, synthetic_options  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from mpifgl.tensor_memory import KINDS  # noqa: E402
from study import rundir  # noqa: E402

MB = 2 ** 20
METHODS = {"cagnet": ["--algo", "cagnet", "--replication", "2"],
           "cagnet-1d": ["--algo", "cagnet", "--replication", "1"],
           "fedavg": ["--algo", "fedavg"], "ours": ["--algo", "ours"],
           # the paper's own setting of its Table 5: s = 500,000 of products' nodes per step
           # (scaled with --scale: method_flags), one pass over the nodes per epoch
           "ours-paper": ["--algo", "ours"]}
# The paper's products column: (training seconds per epoch, memory MB per client).
PAPER = {("cagnet", 4): (38.3888, 855.34), ("fedavg", 4): (16.9388, 402.27),
         ("ours", 4): (5.0169, 100.15), ("cagnet", 8): (35.9513, 427.76),
         ("fedavg", 8): (7.5080, 163.44), ("ours", 8): (4.3342, 50.08)}


@dataclass(frozen=True)
class TimeCostArgs:
    work: Path = option(Path("/tmp/mpifgl-time-cost"), "shards, runs and time_cost.json go here")
    scale: float = option(1.0, "fraction of ogbn-products' nodes and edges (0.1: the quick run)")
    clients: tuple[int, ...] = option((4, 8), "comma-separated client counts")
    methods: tuple[str, ...] = option(tuple(METHODS), "comma-separated subset of "
                                      + ", ".join(METHODS), tuple(METHODS))
    epochs: int = option(5, "epochs per run (>= 2: the first is untimed); the last evaluates")
    rounds: int = option(1, "times every run is repeated, interleaved")
    layers: int = option(3, "graph layers (the paper's products setting)")
    hidden: int = option(128, "hidden width (the paper's)")
    ours_flags: str = option("", "extra mpifgl.train flags for ours, shell-quoted")
    timeout: float = option(4 * 3600.0, "seconds after which a run is killed as failed")


@dataclass
class Measured:
    """One run's figures (clients only unless named)."""

    status: str
    train_seconds: float | None = None  # median over epochs 2..E of the slowest client's
    tensor_mb: tuple[float, float] | None = None  # mean, max over clients
    tensor_kinds_mb: dict[str, float] = field(default_factory=dict)  # mean over clients
    peak_rss_mb: tuple[float, float] | None = None  # mean, max over clients
    client_mb_per_epoch: float | None = None
    test_f1: float | None = None


def measure(out: Path, status: str) -> Measured:
    result = Measured(status)
    records = rundir.read_metrics(out)
    if not records:
        return result
    per_epoch = [max(c + m for c, m in zip(r["per_rank"]["compute_seconds"][1:],
                                           r["per_rank"]["comm_seconds"][1:]))
                 for r in records]
    result.train_seconds = median(per_epoch[1:] or per_epoch)
    training = [r for r in records if "val_micro_f1" not in r] or records
    result.client_mb_per_epoch = mean(
        (s + v) / MB for r in training
        for s, v in zip(r["per_rank"]["bytes_sent"][1:], r["per_rank"]["bytes_received"][1:]))
    rss = records[-1]["per_rank"]["peak_rss_mb"][1:]
    result.peak_rss_mb = (mean(rss), max(rss))
    final_path = out / "final.json"
    if final_path.is_file():
        final = json.loads(final_path.read_text())
        result.test_f1 = final.get("test_micro_f1")
        reports = [r["tensor_bytes"] for r in (final.get("rank_reports") or [])[1:]]
        if reports:
            totals = [sum(r.values()) / MB for r in reports]
            result.tensor_mb = (mean(totals), max(totals))
            result.tensor_kinds_mb = {k: mean(r.get(k, 0) for r in reports) / MB for k in KINDS}
    return result


def combine(runs: list[Measured]) -> Measured:
    """The median over rounds of each figure (the rounds' statuses joined)."""
    done = [r for r in runs if r.status == "done"] or runs

    def middle(values):
        values = [v for v in values if v is not None]
        return median(values) if values else None

    def middle_pair(pairs):
        pairs = [p for p in pairs if p is not None]
        return (median(p[0] for p in pairs), median(p[1] for p in pairs)) if pairs else None

    kinds = {k: middle([r.tensor_kinds_mb.get(k) for r in done]) for k in KINDS}
    return Measured("; ".join(sorted({r.status for r in runs})),
                    middle([r.train_seconds for r in done]),
                    middle_pair([r.tensor_mb for r in done]),
                    {k: v for k, v in kinds.items() if v is not None},
                    middle_pair([r.peak_rss_mb for r in done]),
                    middle([r.client_mb_per_epoch for r in done]),
                    middle([r.test_f1 for r in done]))


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _pair(values: tuple[float, float] | None, digits: int) -> str:
    return "n/a" if values is None else f"{_num(values[0], digits)} / {_num(values[1], digits)}"


def table(results: dict[tuple[str, int], Measured]) -> str:
    lines = [f"{'':26}{'train s/ep':>11}{'tensors MB mean/max':>22}{'RSS MB mean/max':>18}"
             f"{'MB/client/ep':>14}{'test F1':>9}{'paper s, MB':>20}"]
    for (method, clients), m in results.items():
        paper = PAPER.get((method, clients))
        lines.append(
            f"{method + f' ({clients} clients)':26}{_num(m.train_seconds, 3):>11}"
            f"{_pair(m.tensor_mb, 1):>22}{_pair(m.peak_rss_mb, 0):>18}"
            f"{_num(m.client_mb_per_epoch, 1):>14}{_num(m.test_f1, 4):>9}"
            f"{f'{paper[0]:.2f} s, {paper[1]:.0f} MB' if paper else '-':>20}")
        if m.tensor_kinds_mb:
            lines.append(" " * 28 + "tensors by kind (MB, mean over clients): " + ", ".join(
                f"{k} {v:,.1f}" for k, v in m.tensor_kinds_mb.items()))
        if m.status != "done":
            lines.append(" " * 28 + m.status)
    return "\n".join(lines)


def ratios(results: dict[tuple[str, int], Measured]) -> str:
    lines = ["ours / CAGNET: training epoch, mean tensor MB per client "
             "(the paper, against c = 2: 0.13x, 0.12x at 4 clients; 0.12x, 0.12x at 8)"]
    for (method, clients), m in results.items():
        if not method.startswith("ours"):
            continue
        for cagnet in ("cagnet", "cagnet-1d"):
            base = results.get((cagnet, clients))
            if base is None:
                continue
            epoch = (m.train_seconds / base.train_seconds
                     if m.train_seconds and base.train_seconds else None)
            memory = (m.tensor_mb[0] / base.tensor_mb[0]
                      if m.tensor_mb and base.tensor_mb else None)
            lines.append(f"  {method} / {cagnet}, {clients} clients: epoch {_num(epoch)}x, "
                         f"tensors {_num(memory)}x")
    return "\n".join(lines)


def method_flags(method: str, args: TimeCostArgs) -> list[str]:
    """``mpifgl.train``'s flags of ``method``: METHODS', ours-paper's sample at --scale, and
    --ours-flags for both ours rows."""
    flags = list(METHODS[method])
    if method == "ours-paper":
        flags += ["--sample-size", str(max(1, round(PAPER_SAMPLE * args.scale)))]
    return flags + (shlex.split(args.ours_flags) if method.startswith("ours") else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, TimeCostArgs)
    args = dataclass_from_namespace(TimeCostArgs, parser.parse_args())
    if not 0 < args.scale <= 1 or args.epochs < 2 or args.rounds < 1:
        parser.error(f"--scale must be in (0, 1], --epochs >= 2 and --rounds >= 1, got "
                     f"{args.scale}, {args.epochs}, {args.rounds}")
    odd = [m for m in args.clients if m % 2 and "cagnet" in args.methods]
    if odd:
        parser.error(f"--clients {','.join(map(str, odd))}: CAGNET's replication 2 needs an "
                     f"even number of clients")
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"synthetic products x{args.scale:g}: {synthetic_options(args.scale)}", flush=True)
    shards = {m: prepare(args.work, m, args.scale) for m in args.clients}
    plan = [(method, m) for m in args.clients for method in args.methods]
    runs: dict[tuple[str, int], list[Measured]] = {key: [] for key in plan}
    common = ["--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--layers",
              str(args.layers), "--hidden", str(args.hidden), "--force"]
    for round_index in range(args.rounds):
        turn = round_index % len(plan)
        for method, clients in plan[turn:] + plan[:turn]:
            out = args.work / "runs" / f"{method}-m{clients}-r{round_index + 1}"
            command = [sys.executable, "-m", "mpifgl.train", "--shards", str(shards[clients]),
                       "--out", str(out), *method_flags(method, args), *common]
            outcome = run_command(method, clients, command, out, True, args.timeout)
            runs[(method, clients)].append(measure(out, outcome.status))
    results = {key: combine(values) for key, values in runs.items()}
    print(f"\nproducts x{args.scale:g}, {args.layers} layers, hidden {args.hidden}, "
          f"{args.epochs} epochs x {args.rounds} round(s), interleaved; clients only\n")
    print(table(results))
    print()
    print(ratios(results))
    payload = {"args": {k: str(v) for k, v in asdict(args).items()},
               "synthetic": synthetic_options(args.scale),
               "results": [{"method": method, "clients": clients, **asdict(m)}
                           for (method, clients), m in results.items()],
               "rounds": {f"{method}-m{clients}": [asdict(m) for m in values]
                          for (method, clients), values in runs.items()}}
    (args.work / "time_cost.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nresults: {args.work / 'time_cost.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
