"""ogbn-products scale end to end: ours, ours-full and centralized full batch on a
synthetic graph of products size whose generator parameters make the task as hard as products.

    . .venv/bin/activate
    python benchmarks/bench_products.py --work /tmp/mpifgl-products
        [--scale 1.0] [--clients 8,16] [--methods ours,ours-full,centralized] [--epochs 3]
        (--methods fedgcn,llcg,fedsage-plus: FedGCN 2-hop, LLCG and FedSage+, not in the
        default set)
        [--exchange compact] [--timeout 14400]

One invocation prepares the shards (``--work``/shards-*; reused when they already hold the same
request) and then runs, one after the other, each method with each client count (centralized
once, on the first client count's shards):

  ours         mpirun -n M+1 python -m mpifgl.train (label-guided sampling, its default)
  ours-full    the same with --sampling none
  centralized  python -m mpifgl.train --algo centralized (one process, full batch)
  fedgcn       mpirun -n M+1 python -m mpifgl.train --algo fedgcn (2 hops, its defaults)
  llcg         mpirun -n M+1 python -m mpifgl.train --algo llcg (its defaults; the server
               loads the whole graph)
  fedsage-plus mpirun -n M+1 python -m mpifgl.train --algo fedsage-plus (its defaults:
               NeighGen at set-up, then FedAvg on the mended local graphs)

each for ``--epochs`` epochs with one full-graph evaluation at the end (--eval-every = epochs).
A run that fails (non-zero exit, OOM kill, timeout) is recorded as ``failed (exit code, its
last error line)`` (output in --work/runs/<run>/output.log) and the benchmark goes on.
``--scale 0.01`` tries the whole thing at 1/100 size.

Printed per run (one column each; table format in docs/scale.md):
  train s/epoch     per epoch, max over ranks of that rank's compute + comm seconds: training
                    steps only (metrics.jsonl's epoch_seconds includes the evaluation)
  mean train s      mean over epochs 2..E (epoch 1 warms up), the figure the ratios use
  eval s            the evaluated last epoch's epoch_seconds minus its training seconds
  exch/total sent, received per client: MB per epoch, mean and max over clients, from the
                    epochs without evaluation; exchange = per_rank exchange_bytes_sent/received
                    (the cross-client terms alone), "n/a" when the trainer does not record them
  server sent/recv  rank 0's MB per (training) epoch
  peak RSS          per_rank peak_rss_mb (ru_maxrss) of the last recorded epoch: max over ranks
                    and sum over ranks; for centralized also the process's own ru_maxrss (wait4)
  test F1           final.json test_micro_f1
  wall s            the whole command, start-up and final outputs included
Then the ratios ours / centralized: mean training epoch, and sum of ranks' peak RSS over
centralized's peak RSS. Everything is also written to --work/results.json. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from fgl_common.child_session import run_in_session  # noqa: E402
from fgl_common.launch import mpirun_path  # noqa: E402
from study import rundir  # noqa: E402
from study.runner import subprocess_env  # noqa: E402

PRODUCTS_NODES = 2_449_029
PRODUCTS_EDGES = 61_859_140
# The hard generator parameters (docs/scale.md): skewed classes and degrees, homophily 0.8 of the
# true classes, weak features and ambiguous labels; centralized GCN lands near products' accuracy.
HARD_SYNTHETIC = {"syn_features": 100, "syn_classes": 47, "syn_homophily": 0.8,
                  "syn_feature_signal": 0.05, "syn_class_skew": 1.0, "syn_degree_skew": 1.0,
                  "syn_label_noise": 0.25}
METHODS = {"ours": [], "ours-full": ["--sampling", "none"],
           "centralized": ["--algo", "centralized"],
           # FedGCN at its reference settings (2 hops): its round's bytes are set-up traffic,
           # in the run's final.json (pretrain_bytes_*), not in the per-epoch columns
           "fedgcn": ["--algo", "fedgcn"],
           # LLCG at its defaults: the server loads the whole graph (its correction steps and
           # the full-graph evaluation), the clients their induced subgraphs
           "llcg": ["--algo", "llcg"],
           # FedSage+ at its defaults: NeighGen's two phases at set-up (their bytes in
           # final.json's setup_bytes), then FedAvg on the mended graphs
           "fedsage-plus": ["--algo", "fedsage-plus"]}
DEFAULT_METHODS = ("ours", "ours-full", "centralized")
MB = 2 ** 20


@dataclass(frozen=True)
class ProductsBenchArgs:
    work: Path = option(Path("/tmp/mpifgl-products"), "shards, runs and results.json go here")
    scale: float = option(1.0, "fraction of ogbn-products' nodes and edges (0.01: a one-minute "
                               "try)")
    clients: tuple[int, ...] = option((8, 16), "comma-separated client counts")
    methods: tuple[str, ...] = option(DEFAULT_METHODS, "comma-separated subset of "
                                      + ", ".join(METHODS), tuple(METHODS))
    epochs: int = option(3, "epochs per run; the last one evaluates on the full graph")
    exchange: str | None = option(None, "passed to mpifgl.train --exchange (default: the "
                                        "trainer's)")
    timeout: float = option(4 * 3600.0, "seconds after which a run is killed and recorded as "
                                        "failed")


def synthetic_options(scale: float) -> dict:
    return {"syn_nodes": round(PRODUCTS_NODES * scale), "syn_edges": round(PRODUCTS_EDGES * scale),
            **HARD_SYNTHETIC}


def prepare(work: Path, clients: int, scale: float) -> Path:
    """Shards for this client count and scale, written by ``python -m data_prep``; shards
    already there are reused when their manifest records the same request."""
    out = work / f"shards-products-x{scale:g}-random-{clients}clients"
    options = synthetic_options(scale)
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        request = json.loads(manifest_path.read_text()).get("request", {})
        recorded = request.get("synthetic", {})
        wanted = {key[len("syn_"):]: value for key, value in options.items()}
        different = {k: (recorded.get(k), v) for k, v in wanted.items() if recorded.get(k) != v}
        if request.get("num_clients") != clients or different:
            raise SystemExit(f"{out} holds other shards (found/wanted: {different or clients}); "
                             f"remove it or choose another --work")
        print(f"shards {out}: reused", flush=True)
        return out
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    command = [sys.executable, "-m", "data_prep", "--dataset", "synthetic", "--num-clients",
               str(clients), "--partition", "random", "--seed", "0", "--out", str(out), *flags]
    start = time.perf_counter()
    if subprocess.run(command, env=subprocess_env(), cwd=REPO).returncode != 0:
        raise SystemExit(f"preparing {out} failed: {' '.join(command)}")
    print(f"shards {out}: written ({time.perf_counter() - start:.0f} s)", flush=True)
    return out


@dataclass
class Outcome:
    method: str
    clients: int
    status: str = "done"  # done | failed (exit code, error line)
    wall_seconds: float = 0.0
    process_peak_rss_mb: float | None = None  # wait4 ru_maxrss: the command's largest process
    train_seconds: list[float] = field(default_factory=list)  # per epoch, max over ranks
    eval_seconds: float | None = None
    per_client: dict[str, tuple[float, float] | None] = field(default_factory=dict)  # mean, max
    server: dict[str, float] = field(default_factory=dict)
    peak_rss_max_mb: float | None = None
    peak_rss_sum_mb: float | None = None
    test_f1: float | None = None

    @property
    def label(self) -> str:
        return self.method if self.method == "centralized" else f"{self.method} m={self.clients}"

    @property
    def steady_train_seconds(self) -> float | None:
        steady = self.train_seconds[1:] or self.train_seconds
        return mean(steady) if steady else None


def run(method: str, clients: int, shards: Path, work: Path, epochs: int, exchange: str | None,
        timeout: float) -> Outcome:
    out = work / "runs" / (method if method == "centralized" else f"{method}-{clients}")
    command = [sys.executable, "-m", "mpifgl.train", "--shards", str(shards), "--out", str(out),
               "--epochs", str(epochs), "--eval-every", str(epochs), "--force", *METHODS[method]]
    if exchange and method != "centralized":
        command += ["--exchange", exchange]
    return run_command(method, clients, command, out, method != "centralized", timeout)


def run_command(method: str, clients: int, command: list[str], out: Path, distributed: bool,
                timeout: float) -> Outcome:
    """Run one ``python -m mpifgl.train`` command (under mpirun with clients + 1 ranks when
    ``distributed``) into ``out``; its outcome from the exit status and the run's files."""
    if distributed:
        command = [mpirun_path(), "-n", str(clients + 1), *command]
    shutil.rmtree(out, ignore_errors=True)  # no stale metrics when this run fails early
    out.mkdir(parents=True)
    outcome = Outcome(method, clients)
    print(f"\n== {outcome.label}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    log_path = out / "output.log"  # stdout and stderr
    with open(log_path, "w") as log:  # a timeout ends mpirun and every rank (its session)
        finished = run_in_session(command, timeout, env=subprocess_env(), cwd=REPO, stdout=log,
                                  stderr=log)
    if finished.timed_out:
        outcome.status = f"failed (timeout after {timeout:.0f} s)"
    outcome.wall_seconds = time.perf_counter() - start
    if finished.peak_rss_mb is not None:
        outcome.process_peak_rss_mb = finished.peak_rss_mb
    if outcome.status == "done" and (finished.returncode != 0
                                     or not (out / "final.json").exists()):
        outcome.status = f"failed ({finished.returncode}, {last_error_line(log_path)})"
    read_metrics(outcome, out)
    print(f"   {outcome.status}, {outcome.wall_seconds:.0f} s (log: {log_path})", flush=True)
    return outcome


def last_error_line(log_path: Path) -> str:
    """The last output line that names an error or a signal (a Python exception, argparse,
    mpirun's "exited on signal 9 (Killed)"), else the last line with words in it: mpirun's
    closing banner would otherwise hide the cause."""
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()
             if re.search(r"[A-Za-z]", line)]
    for line in reversed(lines):
        if re.search(r"error|exception|killed|signal|out of memory", line, re.IGNORECASE):
            return line
    return lines[-1] if lines else "no output"


def read_metrics(outcome: Outcome, out: Path) -> None:
    """Fill ``outcome`` from the run's metrics.jsonl and final.json (whatever exists)."""
    records = rundir.read_metrics(out)
    if not records:
        return
    for record in records:
        ranks = record["per_rank"]
        outcome.train_seconds.append(max(c + m for c, m in zip(ranks["compute_seconds"],
                                                               ranks["comm_seconds"])))
    last = records[-1]
    if "test_micro_f1" in last:
        outcome.eval_seconds = last["epoch_seconds"] - outcome.train_seconds[-1]
    training = [r for r in records if "test_micro_f1" not in r] or records
    for name in ("exchange_bytes_sent", "exchange_bytes_received", "bytes_sent",
                 "bytes_received"):
        if name not in training[0]["per_rank"]:
            outcome.per_client[name] = None
            continue
        per_rank = [mean(r["per_rank"][name][k] for r in training)
                    for k in range(len(training[0]["per_rank"][name]))]
        if len(per_rank) == 1:  # centralized: one process, nothing moved
            outcome.per_client[name] = None
            continue
        clients = per_rank[1:]  # rank 0 is the server
        outcome.per_client[name] = (mean(clients) / MB, max(clients) / MB)
        outcome.server[name] = per_rank[0] / MB
    rss = last["per_rank"]["peak_rss_mb"]
    outcome.peak_rss_max_mb, outcome.peak_rss_sum_mb = max(rss), sum(rss)
    final = out / "final.json"
    if final.exists():
        outcome.test_f1 = json.loads(final.read_text()).get("test_micro_f1")


# -- the table ----------------------------------------------------------------------------------
def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _pair(value: tuple[float, float] | None) -> str:
    return "n/a" if value is None else f"{value[0]:,.0f} / {value[1]:,.0f}"


def table(outcomes: list[Outcome]) -> str:
    rows: list[tuple[str, list[str]]] = [
        ("status", [o.status for o in outcomes]),
        ("train s/epoch", [" ".join(f"{s:.1f}" for s in o.train_seconds) or "n/a"
                           for o in outcomes]),
        ("mean train s (2..E)", [_num(o.steady_train_seconds) for o in outcomes]),
        ("eval s", [_num(o.eval_seconds) for o in outcomes]),
        ("exch sent MB/client", [_pair(o.per_client.get("exchange_bytes_sent"))
                                 for o in outcomes]),
        ("exch recv MB/client", [_pair(o.per_client.get("exchange_bytes_received"))
                                 for o in outcomes]),
        ("sent MB/client", [_pair(o.per_client.get("bytes_sent")) for o in outcomes]),
        ("recv MB/client", [_pair(o.per_client.get("bytes_received")) for o in outcomes]),
        ("server sent/recv MB", [f"{o.server['bytes_sent']:,.0f} / "
                                 f"{o.server['bytes_received']:,.0f}"
                                 if "bytes_sent" in o.server else "n/a" for o in outcomes]),
        ("peak RSS max rank MB", [_num(o.peak_rss_max_mb, 0) for o in outcomes]),
        ("peak RSS sum MB", [_num(o.peak_rss_sum_mb, 0) for o in outcomes]),
        ("process peak RSS MB", [_num(o.process_peak_rss_mb, 0) for o in outcomes]),
        ("test F1", [_num(o.test_f1, 4) for o in outcomes]),
        ("wall s", [_num(o.wall_seconds, 0) for o in outcomes]),
    ]
    width = max(14, *(len(cell) for _, cells in rows for cell in cells
                      if not cell.startswith("failed")))
    lines = [f"{'':22}" + "".join(f"{o.label:>{width + 2}}" for o in outcomes)]
    for name, cells in rows:
        if name == "status":  # may be long: one line per failed run below the table
            cells = [c.split(" (")[0] for c in cells]
        lines.append(f"{name:22}" + "".join(f"{c:>{width + 2}}" for c in cells))
    lines += [f"{o.label}: {o.status}" for o in outcomes if o.status != "done"]
    return "\n".join(lines)


def ratios(outcomes: list[Outcome]) -> str:
    central = next((o for o in outcomes if o.method == "centralized" and o.status == "done"),
                   None)
    if central is None or not central.steady_train_seconds or not central.peak_rss_max_mb:
        return "ratios: n/a (no finished centralized run)"
    lines = ["ratios to centralized (training epoch: mean over epochs 2..E; memory: sum over "
             "ranks of peak RSS / centralized's peak RSS):"]
    for o in outcomes:
        if o.method == "centralized" or o.steady_train_seconds is None:
            continue
        rss = ("n/a" if o.peak_rss_sum_mb is None
               else f"{o.peak_rss_sum_mb / central.peak_rss_max_mb:.2f}x")
        epoch = o.steady_train_seconds / central.steady_train_seconds
        lines.append(f"  {o.label:16} epoch {epoch:.2f}x   memory {rss}   "
                     f"({o.status.split(' (')[0]})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, ProductsBenchArgs)
    args = dataclass_from_namespace(ProductsBenchArgs, parser.parse_args())
    methods, clients = list(args.methods), list(args.clients)
    if not clients or min(clients) < 1:
        parser.error(f"--clients must list client counts >= 1, got "
                     f"{','.join(map(str, clients))!r}")
    if not 0 < args.scale <= 1 or args.epochs < 1:
        parser.error(f"--scale must be in (0, 1] and --epochs >= 1, got {args.scale}, "
                     f"{args.epochs}")
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"synthetic products x{args.scale:g}: {synthetic_options(args.scale)}", flush=True)

    shards = {m: prepare(args.work, m, args.scale) for m in clients}
    plan = [(method, m) for method in methods if method != "centralized" for m in clients]
    if "centralized" in methods:
        plan.append(("centralized", clients[0]))
    outcomes = [run(method, m, shards[m], args.work, args.epochs, args.exchange, args.timeout)
                for method, m in plan]

    print(f"\nproducts x{args.scale:g}, {args.epochs} epochs (evaluation at the last), "
          f"exchange {args.exchange or 'default'}; MB per epoch, 'mean / max' over clients\n")
    print(table(outcomes))
    print()
    print(ratios(outcomes))
    results = {"scale": args.scale, "epochs": args.epochs, "exchange": args.exchange,
               "synthetic": synthetic_options(args.scale),
               "runs": [asdict(o) for o in outcomes]}
    (args.work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nresults: {args.work / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
