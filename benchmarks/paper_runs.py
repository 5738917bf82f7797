"""What the paper-scale benchmarks share (``paper_configs.py``, ``sample_sweep.py``): the proxy
shards, one training run as a subprocess, and a run directory read back as figures.

Not a benchmark itself; imported by the two scripts (``benchmarks`` is on sys.path as a
namespace package once the repository root is).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from data_prep.proxies import proxy, proxy_options  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace  # noqa: E402
from fgl_common.child_session import run_in_session  # noqa: E402
from fgl_common.launch import mpirun_path  # noqa: E402
from study import rundir  # noqa: E402
from study.catalog import METHODS  # noqa: E402
from study.runner import subprocess_env  # noqa: E402

MB = 2 ** 20
CLIENTS = 8  # the paper's


def override_suffix(overrides: dict[str, Any] | None) -> str:
    """Generator overrides as a folder-name suffix ('' without any)."""
    return "".join(f"-{k.replace('_', '')}{v if isinstance(v, str) else format(v, 'g')}"
                   for k, v in sorted((overrides or {}).items()))


def variant(name: str, scale: float, overrides: dict[str, Any] | None = None) -> str:
    """A proxy at a scale, with its generator overrides: names shard and run folders."""
    return f"{name}-x{scale:g}{override_suffix(overrides)}"


def shard_dir(work: Path, name: str, scale: float, clients: int = CLIENTS,
              overrides: dict[str, Any] | None = None) -> Path:
    return work / "shards" / f"{variant(name, scale, overrides)}-random-m{clients}-s0"


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``FIELD=VALUE`` items (``--set``) as generator overrides."""
    values: dict[str, Any] = {}
    for item in items:
        name, _, text = item.partition("=")
        if not text:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE")
        values[name.strip()] = _number_or_text(text.strip())
    return values


def _number_or_text(text: str) -> int | float | str:
    """``3`` and ``0.3`` as numbers, a word (``popularity``) as itself; the generator's
    ``validate`` judges the value."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def prepare(work: Path, name: str, scale: float, clients: int = CLIENTS,
            overrides: dict[str, Any] | None = None) -> Path:
    """The proxy's shards (random partition, seed 0), written once and reused when the
    manifest holds the same request (``data_prep.api.prepare_shards``)."""
    from data_prep.api import prepare_shards
    out = shard_dir(work, name, scale, clients, overrides)
    start = time.perf_counter()
    manifest = prepare_shards("synthetic", clients, "random", 0, None, out, show_progress=False,
                              **proxy_options(name, scale, **(overrides or {})))
    print(f"shards {out}: {manifest['num_nodes']:,} nodes, {manifest['num_edges']:,} edges, "
          f"train/val/test {manifest['num_train']:,}/{manifest['num_val']:,}/"
          f"{manifest['num_test']:,} ({time.perf_counter() - start:.0f} s)", flush=True)
    return out


def method_flags(method: str) -> tuple[str, list[str]]:
    """``--algo`` and flags of a method of the study's catalog (study/catalog.py)."""
    spec = METHODS[method]
    return spec.algo, list(spec.flags)


def train_command(method: str, shards: Path, out: Path, flags: list[str],
                  clients: int = CLIENTS) -> list[str]:
    algo, extra = method_flags(method)
    command = [sys.executable, "-m", "mpifgl.train", "--algo", algo, "--shards", str(shards),
               "--out", str(out), "--force", *extra, *flags]
    if METHODS[method].distributed:
        command = [mpirun_path(), "-n", str(clients + 1), *command]
    return command


# flags whose value is a path: compared as the file they name, so a work folder reached through
# another path (a link, a moved checkout) still holds the same runs
PATH_FLAGS = ("--shards", "--out")


def training_flags(command: list[str]) -> list[str]:
    """What follows ``-m mpifgl.train`` in a command, with ``PATH_FLAGS``' values resolved: the
    launcher and interpreter paths, and the path a folder is reached by, may differ between
    machines without changing the run."""
    flags = command[command.index("mpifgl.train") + 1:] if "mpifgl.train" in command \
        else list(command)
    return [os.path.realpath(value) if i and flags[i - 1] in PATH_FLAGS else value
            for i, value in enumerate(flags)]


def set_aside(out: Path) -> Path:
    """Rename a finished run's folder (and its log) to the first free ``NAME.replaced-K``, so a
    run with other flags in its place loses nothing of it; returns the new folder."""
    k = 1
    while (out.parent / f"{out.name}.replaced-{k}").exists():
        k += 1
    kept = out.parent / f"{out.name}.replaced-{k}"
    out.rename(kept)
    log = out.parent / f"{out.name}.log"
    if log.is_file():
        log.rename(out.parent / f"{kept.name}.log")
    return kept


def run(command: list[str], out: Path, timeout: float, nice: int = 10) -> dict[str, Any]:
    """Run one training command (its own process group, niced), unless ``out/final.json``
    exists already from the same training flags (resume). Any other finished run there (other
    flags, or no driver's record) is set aside (``set_aside``), not overwritten, and the command
    runs. Returns the driver's
    record: status, wall seconds, the command's peak RSS (wait4: its largest process)."""
    record_path = out / "driver.json"
    if rundir.run_status(out) == "done":
        record = rundir.read_json(record_path)
        if record and training_flags(record.get("command", [])) == training_flags(command):
            return record
        kept = set_aside(out)  # other flags, or run by hand (no readable driver.json)
        print(f"   {out}: finished with other or unrecorded flags; that run is now {kept}, "
              "running this one", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("final.json", "metrics.jsonl"):  # an unfinished run's: it starts afresh
        (out / stale).unlink(missing_ok=True)
    distributed = command[0] == mpirun_path()
    env = subprocess_env(one_thread_per_rank=distributed)
    print(f"   $ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    record: dict[str, Any] = {"command": command, "status": "done"}
    with open(out.parent / f"{out.name}.log", "w") as log:  # a timeout ends every rank too
        finished = run_in_session(command, timeout, env=env, cwd=REPO, stdout=log, stderr=log,
                                  preexec_fn=(lambda: os.nice(nice)) if nice else None)
    if finished.timed_out:
        record["status"] = f"failed (timeout after {timeout:.0f} s)"
    else:
        record["process_peak_rss_mb"] = finished.peak_rss_mb
        if finished.returncode != 0 or not (out / "final.json").is_file():
            record["status"] = f"failed (exit {finished.returncode})"
    record["wall_seconds"] = time.perf_counter() - start
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


@dataclass
class RunFigures:
    """A run directory read back: the score, the curve and the cost."""

    status: str
    test: float | None = None  # test micro-F1 at the best validation epoch
    val: float | None = None
    best_epoch: int | None = None
    epochs: int = 0
    train_seconds: float | None = None  # median over epochs 2.. of max-over-ranks training time
    eval_seconds: float | None = None  # median evaluation time (evaluated epochs)
    sent_mb_per_client: float | None = None  # per training epoch, mean over clients
    received_mb_per_client: float | None = None
    exchange_sent_mb_per_client: float | None = None
    peak_rss_max_mb: float | None = None
    peak_rss_sum_mb: float | None = None
    wall_seconds: float | None = None
    curve: list[dict[str, float]] = field(default_factory=list)  # epoch, loss, F1 per split

    @property
    def last_loss(self) -> float | None:
        return self.curve[-1]["loss"] if self.curve else None

    @property
    def last_test(self) -> float | None:
        """Test micro-F1 of the last evaluated epoch (the model training ends with)."""
        scored = [point["test"] for point in self.curve if "test" in point]
        return scored[-1] if scored else None

    def min_loss(self) -> float | None:
        return min(point["loss"] for point in self.curve) if self.curve else None


def read_run(out: Path) -> RunFigures:
    driver = rundir.read_json(out / "driver.json") or {}
    final = rundir.read_json(out / "final.json")
    figures = RunFigures(driver.get("status", "missing" if final is None else "done"),
                         wall_seconds=driver.get("wall_seconds"))
    if final is not None:
        figures.test, figures.val = final["test_micro_f1"], final["best_val_micro_f1"]
        figures.best_epoch = final["best_epoch"]
    records = rundir.read_metrics(out)
    if not records:
        return figures
    figures.epochs = records[-1]["epoch"]
    train, evaluation = [], []
    for record in records:
        ranks = record["per_rank"]
        seconds = max(c + m for c, m in zip(ranks["compute_seconds"], ranks["comm_seconds"]))
        train.append(seconds)
        if "test_micro_f1" in record:
            evaluation.append(record["epoch_seconds"] - seconds)
        point = {"epoch": record["epoch"], "loss": record["loss"]}
        point.update({s: record[f"{s}_micro_f1"] for s in ("train", "val", "test")
                      if f"{s}_micro_f1" in record})
        figures.curve.append(point)
    figures.train_seconds = median(train[1:] or train)
    figures.eval_seconds = median(evaluation) if evaluation else None
    training = [r for r in records if "test_micro_f1" not in r] or records
    ranks = len(training[0]["per_rank"]["bytes_sent"])
    if ranks > 1:  # rank 0 is the server
        def per_client(name: str) -> float:
            return mean(mean(r["per_rank"][name][k] for r in training)
                        for k in range(1, ranks)) / MB
        figures.sent_mb_per_client = per_client("bytes_sent")
        figures.received_mb_per_client = per_client("bytes_received")
        figures.exchange_sent_mb_per_client = per_client("exchange_bytes_sent")
    rss = records[-1]["per_rank"]["peak_rss_mb"]
    figures.peak_rss_max_mb, figures.peak_rss_sum_mb = max(rss), sum(rss)
    return figures


def plot_curves(runs: dict[str, Path], path: Path, title: str) -> None:
    """Test micro-F1 and training loss per epoch of each run (matplotlib, one PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, out in runs.items():
        curve = read_run(out).curve
        if not curve:
            continue
        scored = [p for p in curve if "test" in p]
        left.plot([p["epoch"] for p in scored], [100 * p["test"] for p in scored], label=label)
        right.plot([p["epoch"] for p in curve], [p["loss"] for p in curve], label=label)
    left.set(xlabel="epoch", ylabel="test micro-F1 (%)", title=title)
    right.set(xlabel="epoch", ylabel="training loss", yscale="log", title="training loss")
    left.grid(alpha=0.3)
    right.grid(alpha=0.3)
    left.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def paper_sample_size(name: str, scale: float) -> int:
    return proxy(name).sample_size_at(scale)


def parse_arguments(args_class: type, argv: list[str] | None, description: str):
    """``args_class`` from the command line, the flags after ``--`` apart (they go to every
    ``mpifgl.train``): returns (parser, args, extra)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=description)
    add_dataclass_arguments(parser, args_class)
    return parser, dataclass_from_namespace(args_class, parser.parse_args(argv)), extra

