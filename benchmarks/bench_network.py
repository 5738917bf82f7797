"""Epoch time against the network: training with the clients split over two namespace hosts
(tests/helpers/netns.py) whose link is shaped to each rate in turn, and a cost model beside
every measurement.

    . .venv/bin/activate          # as root: the hosts are network namespaces
    python benchmarks/bench_network.py --work /tmp/mpifgl-network
        [--datasets amazon-computers,products-0.1] [--methods ours,ours-compact-reduce,...]
        [--rates 25g,10g,1g,100m] [--epochs 5] [--repeats 1] [--clients 8] [--remote 4]

Layout: the server and ``clients - remote`` clients on node1, ``remote`` clients on node2
(default 4 and 4), one bridge between them; each rate shapes both directions of both hosts'
links with tbf (``netns.tbf_arguments``: its bucket and queue), and a first, unshaped setting is
the reference. Datasets: amazon-computers (random 8-client shards, data_prep) and products-0.1,
the hard synthetic graph of 1/10 ogbn-products size (benchmarks/bench_products.py). Methods
(``--methods``): ours (its default exchange, compact), ours-compact-reduce, ours-reduce,
ours-star, ours-bf16 (compact with ``--wire-dtype bfloat16``), ours-full (``--sampling none``:
one full-graph step per epoch), ours-full-bf16, fedavg, and cagnet where the registry has
``--algo cagnet``; the default is all of them but ours-star and ours-full-bf16. ``--repeats R``
runs every setting R times in interleaved rounds (this machine's speed drifts) and reports
medians.

Per setting, first ``benchmarks/link_probe.py`` under the same layout measures the latency of
one small collective (lambda) and the bandwidth the link gives many clients at once (R). Per run
it prints, over the training epochs without evaluation (2..E-1; with E = 2, epoch 1):

  s/epoch        training seconds per epoch: max over ranks of compute + communication
  link MB        bytes per epoch on node2's link, both directions (its veth's counters, read
                 at each epoch's end), and packets
  collectives    buffer collectives per epoch (the server's count, metrics.jsonl
                 ``collectives``): the messages, each at least one latency
  predicted      compute + link bytes / R + collectives x lambda, where compute is the
                 unshaped run's epoch minus its own bytes / R0 and collectives x lambda0
  error          (measured - predicted) / measured

then, per method, the model's prediction for a wide-area link of 20 ms round trips (10 ms one
way on every collective) at 1 Gb/s and 100 Mb/s. Everything also goes to --work/results.json.
Asserts nothing; needs root (namespaces) and runs for tens of minutes at the defaults.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from mpifgl.registry import METHODS  # noqa: E402
from study.rundir import read_metrics  # noqa: E402
from study.runner import prepare_shards_subprocess, subprocess_env  # noqa: E402
from tests.helpers.netns import NamespaceHosts, missing_requirements  # noqa: E402

MB = 2 ** 20
# name -> (the --algo it needs, mpifgl.train flags)
RUNS = {"ours": ("ours", []),
        "ours-compact-reduce": ("ours", ["--exchange", "compact-reduce"]),
        "ours-reduce": ("ours", ["--exchange", "reduce"]),
        "ours-star": ("ours", ["--exchange", "star"]),
        "ours-bf16": ("ours", ["--wire-dtype", "bfloat16"]),
        "ours-full": ("ours", ["--sampling", "none"]),
        "ours-full-bf16": ("ours", ["--sampling", "none", "--wire-dtype", "bfloat16"]),
        "fedavg": ("fedavg", ["--algo", "fedavg"]),
        "cagnet": ("cagnet", ["--algo", "cagnet"])}
AVAILABLE = tuple(name for name, (algo, _) in RUNS.items() if algo in METHODS)
DEFAULT_RUNS = tuple(n for n in AVAILABLE if n not in ("ours-star", "ours-full-bf16"))
DATASETS = ("amazon-computers", "products-0.1")
WAN_ONE_WAY_SECONDS = 0.010  # a 20 ms round trip
WAN_RATES = {"1 Gb/s": 1e9, "100 Mb/s": 1e8}
POLL_SECONDS = 0.02
PROBE_SECONDS = 0.4  # of bulk transfer per bandwidth measurement, at the nominal rate
UNSHAPED_GUESS = 10e9  # bits/s, only to size the unshaped bandwidth probe


@dataclass(frozen=True)
class NetworkBenchArgs:
    work: Path = option(Path("/tmp/mpifgl-network"), "shards, runs and results.json go here")
    datasets: tuple[str, ...] = option(DATASETS, "comma-separated subset of "
                                       + ", ".join(DATASETS), DATASETS)
    methods: tuple[str, ...] = option(DEFAULT_RUNS, "comma-separated subset of "
                                      + ", ".join(AVAILABLE), AVAILABLE)
    rates: tuple[str, ...] = option(("25g", "10g", "1g", "100m"),
                                    "link rates after the unshaped reference: a number with "
                                    "k, m or g (bits per second)")
    epochs: int = option(5, "epochs per run (the last one evaluates and is not measured)")
    repeats: int = option(1, "interleaved rounds of every setting; medians are reported")
    clients: int = option(8, "clients (ranks: one more)")
    remote: int = option(4, "of them on node2; the server and the rest on node1")
    data_root: str | None = option(None, "raw datasets (data_prep's --data-root)")
    timeout: float = option(3600.0, "seconds after which a run is killed and recorded as failed")


def parse_rate(text: str) -> float:
    """'100m' -> 1e8 bits per second; ValueError naming the flag otherwise."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    try:
        return float(text[:-1]) * units[text[-1].lower()]
    except (KeyError, ValueError, IndexError):
        raise ValueError(f"--rates {text!r}: expected a number followed by k, m or g "
                         f"(bits per second), e.g. 100m") from None


def rate_label(rate: float | None) -> str:
    if rate is None:
        return "unshaped"
    for unit, scale in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if rate >= scale:
            return f"{rate / scale:g} {unit}"
    return f"{rate:g} b/s"


def prepare(dataset: str, args: NetworkBenchArgs) -> Path:
    if dataset == "products-0.1":
        sys.path.insert(0, str(REPO / "benchmarks"))
        from bench_products import prepare as prepare_products
        return prepare_products(args.work, args.clients, 0.1)
    out = args.work / "shards" / f"{dataset}-random-m{args.clients}-s0"
    if not (out / "manifest.json").is_file():
        prepare_shards_subprocess(dataset, args.clients, "random", args.data_root, out)
    return out


@dataclass
class Run:
    """One training run's figures over its measured epochs."""

    method: str
    rate: float | None
    status: str = "done"
    epoch_seconds: list[float] = field(default_factory=list)
    link_bytes: list[float] = field(default_factory=list)  # node2's link, both directions
    link_packets: list[float] = field(default_factory=list)
    collectives: list[float] = field(default_factory=list)
    predicted: float | None = None

    def steady(self, name: str) -> float | None:
        values = getattr(self, name)
        return median(values) if values else None


class LinkWatcher:
    """Reads node2's link counters whenever the run's metrics.jsonl gains an epoch (and once
    when config.json appears, the start of epoch 1), in a thread, while the run goes on."""

    def __init__(self, hosts: NamespaceHosts, run_dir: Path, host: str = "node2"):
        self.hosts, self.run_dir, self.host = hosts, run_dir, host
        self.marks: list[dict[str, int]] = []  # at the start of epoch 1, then at each epoch end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _counters(self) -> dict[str, int]:
        return self.hosts.link_counters()[self.host]

    def _watch(self) -> None:
        metrics, seen, started = self.run_dir / "metrics.jsonl", 0, False
        while not self._stop.is_set():
            if not started and (self.run_dir / "config.json").is_file():
                self.marks.append(self._counters())
                started = True
            if started and metrics.is_file():
                lines = metrics.read_bytes().count(b"\n")
                if lines > seen:
                    counters = self._counters()
                    self.marks.extend([counters] * (lines - seen))
                    seen = lines
            time.sleep(POLL_SECONDS)

    def __enter__(self) -> "LinkWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def per_epoch(self, key_pair: tuple[str, str]) -> list[int]:
        totals = [m[key_pair[0]] + m[key_pair[1]] for m in self.marks]
        return [b - a for a, b in zip(totals, totals[1:])]


def train(hosts: NamespaceHosts, slots: dict[int, int], shards: Path, run_dir: Path,
          method: str, rate: float | None, args: NetworkBenchArgs) -> Run:
    result = Run(method, rate)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.jsonl"):
        (run_dir / name).unlink(missing_ok=True)
    argv = ["-m", "mpifgl.train", "--shards", str(shards), "--out", str(run_dir),
            "--epochs", str(args.epochs), "--eval-every", str(10 * args.epochs), "--force",
            *RUNS[method][1]]
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log, \
            LinkWatcher(hosts, run_dir) as watcher:
        process = subprocess.Popen(hosts.mpirun_command(args.clients + 1, argv, slots),
                                   env=subprocess_env(), cwd=REPO, stdout=log,
                                   stderr=subprocess.STDOUT)
        code = None
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also when this benchmark is stopped: no run outlives it
            code = code if code is not None else stop_run(process)
        time.sleep(3 * POLL_SECONDS)  # the last epoch's mark
    if code != 0:
        result.status = f"failed (exit {code}; see {run_dir.parent / run_dir.name}.log)"
        return result
    records = read_metrics(run_dir)
    measured = list(range(1, len(records) - 1)) if len(records) > 2 else [0]
    link_bytes = watcher.per_epoch(("tx_bytes", "rx_bytes"))
    packets = watcher.per_epoch(("tx_packets", "rx_packets"))
    for k in measured:
        per_rank = records[k]["per_rank"]
        result.epoch_seconds.append(max(c + m for c, m in zip(per_rank["compute_seconds"],
                                                                per_rank["comm_seconds"])))
        result.collectives.append(records[k].get("collectives", 0))
        if k < len(link_bytes):
            result.link_bytes.append(link_bytes[k])
            result.link_packets.append(packets[k])
    return result


def stop_run(process: subprocess.Popen) -> int:
    """SIGTERM to mpirun (it ends its ranks), SIGKILL if it is still there after a while."""
    process.terminate()
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def probe_link(hosts: NamespaceHosts, slots: dict[int, int], rate: float | None,
               args: NetworkBenchArgs, out: Path) -> dict:
    bits = rate or UNSHAPED_GUESS
    per_rank = int(min(32 * MB, max(MB, bits / 8 * PROBE_SECONDS / max(1, args.remote))))
    done = hosts.mpirun(args.clients + 1, [str(REPO / "benchmarks" / "link_probe.py"), str(out),
                                           str(per_rank)], slots, subprocess_env(),
                        timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"link probe failed at {rate_label(rate)}: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def predict(runs: list[Run], probes: dict[float | None, dict]) -> dict[str, float]:
    """Fill each run's prediction from its method's unshaped run; return compute per method."""
    compute = {}
    for run in runs:
        if run.rate is None and run.status == "done" and run.link_bytes:
            probe = probes[None]
            compute[run.method] = (run.steady("epoch_seconds")
                                   - run.steady("link_bytes") / probe["bandwidth_bytes_per_second"]
                                   - run.steady("collectives") * probe["latency_seconds"])
    for run in runs:
        if run.method in compute and run.status == "done" and run.link_bytes:
            probe = probes[run.rate]
            run.predicted = (compute[run.method]
                             + run.steady("link_bytes") / probe["bandwidth_bytes_per_second"]
                             + run.steady("collectives") * probe["latency_seconds"])
    return compute


def table(dataset: str, runs: list[Run], probes: dict, args: NetworkBenchArgs,
          compute: dict[str, float]) -> str:
    lines = [f"\n{dataset}: {args.clients} clients, server and {args.clients - args.remote} on "
             f"node1, {args.remote} on node2; medians over epochs 2..E-1 and {args.repeats} "
             f"round(s)"]
    for rate, probe in probes.items():
        lines.append(f"  {rate_label(rate):>10s}: latency {probe['latency_seconds'] * 1e3:.3f} "
                     f"ms per collective, bandwidth {probe['bandwidth_bytes_per_second'] * 8 / 1e9:.3f}"
                     f" Gb/s for {args.remote} clients at once")
    lines.append(f"  {'link':>10s} {'method':20s} {'s/epoch':>8s} {'predicted':>9s} {'error':>6s} "
                 f"{'link MB':>8s} {'packets':>8s} {'collectives':>11s} {'x unshaped':>10s}")
    reference = {r.method: r.steady("epoch_seconds") for r in runs if r.rate is None}
    for run in runs:
        if run.status != "done":
            lines.append(f"  {rate_label(run.rate):>10s} {run.method:20s} {run.status}")
            continue
        seconds = run.steady("epoch_seconds")
        error = (f"{100 * (seconds - run.predicted) / seconds:5.0f}%"
                 if run.predicted is not None else "   n/a")
        link = run.steady("link_bytes")
        slower = reference.get(run.method)
        lines.append(
            f"  {rate_label(run.rate):>10s} {run.method:20s} {seconds:8.3f} "
            f"{run.predicted if run.predicted is not None else float('nan'):9.3f} {error:>6s} "
            f"{(link or 0) / MB:8.1f} {run.steady('link_packets') or 0:8.0f} "
            f"{run.steady('collectives'):11.0f} "
            f"{seconds / slower if slower else float('nan'):10.2f}")
    lines.append("  the model on a wide-area link (10 ms one way on every collective):")
    for method, base in compute.items():
        unshaped = next(r for r in runs if r.method == method and r.rate is None)
        link, calls = unshaped.steady("link_bytes"), unshaped.steady("collectives")
        local = probes[None]["latency_seconds"]
        cells = [f"{label} {base + link * 8 / bits + calls * (local + WAN_ONE_WAY_SECONDS):.2f} s"
                 for label, bits in WAN_RATES.items()]
        lines.append(f"    {method:20s} compute {base:.3f} s + {link / MB:.1f} MB + {calls:.0f} "
                     f"collectives: " + ", ".join(cells))
    return "\n".join(lines)


def _stop(signum: int, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds the with-blocks: the namespaces are removed


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, NetworkBenchArgs)
    args = dataclass_from_namespace(NetworkBenchArgs, parser.parse_args())
    try:
        rates = [None] + [parse_rate(r) for r in args.rates]
    except ValueError as exc:
        parser.error(str(exc))
    if not 1 <= args.remote < args.clients:
        parser.error(f"--remote {args.remote}: expected 1..{args.clients - 1} clients on node2")
    reason = missing_requirements()
    if reason:
        parser.error(f"this benchmark needs namespace hosts: {reason}")
    slots = {1: args.clients + 1 - args.remote, 2: args.remote}
    results = {}
    with NamespaceHosts(2, args.work / "hosts") as hosts:
        for dataset in args.datasets:
            shards = prepare(dataset, args)
            runs: list[Run] = []
            probes: dict[float | None, list[dict]] = {}
            for round_index in range(args.repeats):
                for rate in rates:
                    hosts.shape(rate)
                    where = args.work / "runs" / dataset / rate_label(rate).replace(" ", "").replace("/", "")
                    where.mkdir(parents=True, exist_ok=True)
                    probes.setdefault(rate, []).append(
                        probe_link(hosts, slots, rate, args, where / "probe.json"))
                    for method in args.methods:
                        run = train(hosts, slots, shards, where / f"{method}-r{round_index}",
                                    method, rate, args)
                        print(f"{dataset} {rate_label(rate)} {method} round {round_index + 1}: "
                              f"{run.status}, {run.steady('epoch_seconds') or 0:.3f} s/epoch",
                              flush=True)
                        runs.append(run)
            hosts.shape(None)
            merged = merge_rounds(runs)
            probe = {rate: {key: median(p[key] for p in found) for key in
                            ("latency_seconds", "bandwidth_bytes_per_second")}
                     for rate, found in probes.items()}
            compute = predict(merged, probe)
            print(table(dataset, merged, probe, args, compute), flush=True)
            results[dataset] = {"runs": [asdict(r) for r in merged],
                                "probes": {rate_label(r): p for r, p in probe.items()},
                                "compute_seconds": compute}
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    return 0


def merge_rounds(runs: list[Run]) -> list[Run]:
    """One Run per (method, rate) holding every round's measured epochs."""
    merged: dict[tuple[str, float | None], Run] = {}
    for run in runs:
        key = (run.method, run.rate)
        if key not in merged:
            merged[key] = Run(run.method, run.rate)
        target = merged[key]
        if run.status != "done":
            target.status = run.status
            continue
        for name in ("epoch_seconds", "link_bytes", "link_packets", "collectives"):
            getattr(target, name).extend(getattr(run, name))
    return sorted(merged.values(), key=lambda r: (r.rate is not None, -(r.rate or 0),
                                                  list(RUNS).index(r.method)))


if __name__ == "__main__":
    sys.exit(main())
