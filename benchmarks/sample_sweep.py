"""Sample size against accuracy and time per epoch on a proxy (the paper's Figure 5 idea: the
nodes drawn per epoch fixed, the steps per epoch k varied, each step drawing s = N / k).

    . .venv/bin/activate
    python benchmarks/sample_sweep.py --work /work/scratch/sweep
        [--proxy products] [--scale 0.025] [--steps 1,2,3,4,6,8,12] [--nodes-per-epoch 0]
        [--epochs 100] [--eval-every 5] [--seeds 0] [--lr 0.01] [--layers 0]
        [--references centralized,ours-full] [--sampler-flags=--exact-first-layer]
        [--report-only] [-- EXTRA mpifgl.train FLAGS]

For every k of ``--steps``: ``mpirun -n 9 python -m mpifgl.train`` (ours, label-guided) with
``--steps-per-epoch k --sample-size N/k`` (N = ``--nodes-per-epoch``, 0: the graph's n, one
pass over the nodes per epoch), the paper's depth for the proxy (``--layers`` 0) and hidden 128,
dropout 0.2, for ``--epochs`` epochs; plus the full-batch references (centralized in one process,
ours-full over MPI). Printed and written to WORK/sweep-<proxy>-x<scale>[-<sampler flags>].md:
per k, test micro-F1 at the best validation epoch (mean over seeds), the best epoch, the
lowest training loss, seconds per training epoch (max over ranks of compute + communication,
median over epochs 2..E) and its communication share, MB a client sends per epoch, peak RSS of
the largest rank; the curves in WORK/sweep-<proxy>-x<scale>[-<sampler flags>].png.
``--sampler-flags`` go to the k runs only (the references stay shared between sweeps); flags
after ``--`` go to every ``mpifgl.train``. Resumable like paper_configs.py (runs at an lr other
than 0.01 are named ``...-lr<lr>-s<seed>``). Asserts nothing.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.paper_runs import (parse_arguments, parse_overrides, plot_curves,  # noqa: E402
                                   prepare, read_run, run, train_command, variant)
from data_prep.proxies import PROXIES, proxy  # noqa: E402
from fgl_common.cli import option  # noqa: E402


DEFAULT_LR = 0.01


@dataclass(frozen=True)
class SweepArgs:
    work: Path = option(Path("/tmp/mpifgl-sweep"), "shards, runs, sweep.md and sweep.png")
    proxy: str = option("products", "which proxy", tuple(PROXIES))
    scale: float = option(0.025, "fraction of the real graph's nodes and edges")
    set: tuple[str, ...] = option((), "generator overrides FIELD=VALUE, comma-separated (e.g. "
                                      "feature_signal=0.05: the weak-feature graph)")
    steps: tuple[int, ...] = option((1, 2, 3, 4, 6, 8, 12), "steps per epoch k")
    nodes_per_epoch: int = option(0, "draws per epoch N (s = N / k); 0: the graph's node count")
    epochs: int = option(100, "epochs per run")
    eval_every: int = option(5, "full-graph evaluation every this many epochs")
    seeds: tuple[int, ...] = option((0,), "seeds (mean over them)")
    lr: float = option(DEFAULT_LR, "Adam learning rate")
    layers: int = option(0, "layers; 0: the paper's depth for the proxy")
    references: tuple[str, ...] = option(("centralized", "ours-full"), "full-batch reference "
                                         "methods run once per seed", ("centralized",
                                                                       "ours-full"))
    sampler_flags: tuple[str, ...] = option((), "extra mpifgl.train flags of the k runs only, "
                                                "comma-separated (e.g. --exact-first-layer); "
                                                "they name those runs' folders and the outputs")
    timeout: float = option(86400.0, "seconds after which a run is killed")
    report_only: bool = option(False, "write the table from the runs present")


def graph_nodes(args: SweepArgs) -> int:
    return proxy(args.proxy).config(args.scale).nodes


def per_epoch(args: SweepArgs) -> int:
    return args.nodes_per_epoch or graph_nodes(args)


def sample_size(args: SweepArgs, k: int) -> int:
    return max(1, per_epoch(args) // k)


def tag(args: SweepArgs) -> str:
    """What --sampler-flags add to the names of the k runs and of the outputs."""
    return "".join(f"-{flag.lstrip('-')}" for flag in args.sampler_flags)


def lr_tag(args: SweepArgs) -> str:
    """Runs at another lr than the default get their own names (a finished run is read, not
    rerun, so names must differ wherever the numbers would)."""
    return "" if args.lr == DEFAULT_LR else f"-lr{args.lr:g}"


def run_dir(args: SweepArgs, label: str, seed: int) -> Path:
    return (args.work / "runs" / variant(args.proxy, args.scale, parse_overrides(args.set))
            / f"{label}{lr_tag(args)}-s{seed}")


def k_label(args: SweepArgs, k: int) -> str:
    return f"k{k}{tag(args)}"


def common_flags(args: SweepArgs, seed: int, extra: list[str]) -> list[str]:
    return ["--layers", str(args.layers or proxy(args.proxy).layers), "--lr", f"{args.lr:g}",
            "--seed", str(seed), "--epochs", str(args.epochs), "--eval-every",
            str(args.eval_every), "--log-every", str(args.eval_every), *extra]


def execute(args: SweepArgs, extra: list[str]) -> None:
    shards = prepare(args.work, args.proxy, args.scale, overrides=parse_overrides(args.set))
    for seed in args.seeds:
        for k in args.steps:
            out = run_dir(args, k_label(args, k), seed)
            flags = ["--steps-per-epoch", str(k), "--sample-size", str(sample_size(args, k)),
                     *args.sampler_flags]
            record = run(train_command("ours", shards, out, flags + common_flags(args, seed,
                                                                                 extra)),
                         out, args.timeout)
            print(f"   k={k}: {record['status']}, {line(read_run(out))}", flush=True)
        for method in args.references:
            out = run_dir(args, method, seed)
            record = run(train_command(method, shards, out, common_flags(args, seed, extra)),
                         out, args.timeout)
            print(f"   {method}: {record['status']}, {line(read_run(out))}", flush=True)


def line(figures) -> str:
    test = "n/a" if figures.test is None else f"{100 * figures.test:.2f}"
    return (f"test {test} (epoch {figures.best_epoch}), {figures.train_seconds or 0:.2f} "
            f"s/epoch, wall {figures.wall_seconds or 0:.0f} s")


def _mean(values: list[float]) -> str:
    if not values:
        return "n/a"
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.2f}{spread}"


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def table(args: SweepArgs) -> str:
    n = graph_nodes(args)
    lines = [f"{variant(args.proxy, args.scale, parse_overrides(args.set))} ({n:,} nodes), "
             f"{per_epoch(args):,} draws per "
             f"epoch, {args.layers or proxy(args.proxy).layers} layers, lr {args.lr:g}, "
             f"{args.epochs} epochs, evaluation every {args.eval_every}, seeds "
             f"{','.join(map(str, args.seeds))}", "",
             "| run | s per step | s / n | test micro-F1 (%) | best epoch | last epoch's test | "
             "lowest loss | s / training epoch | of it communication | MB sent / client / epoch "
             "| peak RSS max rank (MB) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    flags = "".join(f" {flag}" for flag in args.sampler_flags)
    labels = [(k_label(args, k), f"k = {k}{flags}", sample_size(args, k)) for k in args.steps]
    labels += [(m, m, None) for m in args.references]
    for label, shown, size in labels:
        runs = [read_run(run_dir(args, label, s)) for s in args.seeds]
        done = [r for r in runs if r.test is not None]
        if not done:
            lines.append(f"| {shown} | {size or 'all'} | | not run | | | | | | | |")
            continue
        first = done[0]
        comm = None
        out = run_dir(args, label, args.seeds[0])
        from study import rundir
        records = rundir.read_metrics(out)[1:]
        if records:
            comm = statistics.median(r["comm_seconds"] for r in records)
        lines.append(
            f"| {shown} | {f'{size:,}' if size else 'all (full batch)'} | "
            f"{f'{size / n:.3f}' if size else '1'} | {_mean([100 * r.test for r in done])} | "
            f"{first.best_epoch} | {_num(first.last_test and 100 * first.last_test, 2)} | "
            f"{_num(first.min_loss(), 3)} | {_num(first.train_seconds, 2)}"
            f" | {_num(comm, 2)} | {_num(first.sent_mb_per_client, 0)} | "
            f"{_num(first.peak_rss_max_mb, 0)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser, args, extra = parse_arguments(SweepArgs, argv, __doc__.split("\n\n")[0])
    if not args.steps or min(args.steps) < 1 or not args.seeds:
        parser.error("--steps needs integers >= 1 and --seeds at least one seed")
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        execute(args, extra)
    text = table(args)
    name = variant(args.proxy, args.scale, parse_overrides(args.set)) + tag(args) + lr_tag(args)
    (args.work / f"sweep-{name}.md").write_text(text + "\n")
    print(text)
    runs = {f"k = {k} (s = {sample_size(args, k):,})": run_dir(args, k_label(args, k),
                                                               args.seeds[0])
            for k in args.steps}
    runs.update({m: run_dir(args, m, args.seeds[0]) for m in args.references})
    plot_curves(runs, args.work / f"sweep-{name}.png", f"{name}: steps per epoch k, s = N / k")
    print(f"curves: {args.work / f'sweep-{name}.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
