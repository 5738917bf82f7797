"""Draw what runs recorded: ``python -m mpifgl.plot RUN_DIR [RUN_DIR ...] [--out PNG]``.

One PNG of four panels over epochs, several runs overlaid (one colour per run): the training
loss; micro-F1 on train (dashed), val (dotted) and test (solid); the epoch's seconds (training
and evaluation, the slowest rank); and the bytes a client rank sent and received in the epoch
(mean over the client ranks, MiB; 0 for a run in one process). It reads ``metrics.jsonl`` only,
so it also draws a run that is still going or stopped early. ``--x seconds`` draws the same
panels over the run's seconds instead (``elapsed_seconds``: training and evaluation since
training began; the sum of the epochs' seconds for runs recorded before it): micro-F1 against
time, for comparing methods by time to accuracy.

Plain json + matplotlib (Agg): no torch, no MPI.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option
from fgl_common.diskspace import write_bytes
from fgl_common.protected import ProtectedPathError, check_output_file

PROG = "mpifgl.plot"
SPLIT_STYLES = {"train": "--", "val": ":", "test": "-"}
MIB = 2 ** 20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
X_AXES = {"epoch": "epoch", "seconds": "seconds of training and evaluation"}


class PlotError(ValueError):
    """A run directory that cannot be drawn (missing or unreadable metrics)."""


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The epochs of ``run_dir/metrics.jsonl``; PlotError naming the file when there are none.
    A torn last line (a run killed mid-write by an older version) is left out."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        what = "no such directory" if not run_dir.is_dir() else "missing"
        raise PlotError(f"{path}: {what}; expected the run directory of `python -m "
                        f"mpifgl.train`")
    records, lines = [], path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            if number < len(lines):
                raise PlotError(f"{path}: line {number} is not JSON") from None
    if not records:
        raise PlotError(f"{path}: no epoch recorded yet")
    return records


def client_mib(record: dict[str, Any]) -> float:
    """MiB a client rank sent + received in the epoch, mean over client ranks (rank 0 is the
    server; a world of one rank is its own client)."""
    sent, received = record.get("bytes_sent", [0]), record.get("bytes_received", [0])
    clients = slice(1, None) if len(sent) > 1 else slice(0, 1)
    totals = [s + r for s, r in zip(sent[clients], received[clients])]
    return sum(totals) / len(totals) / MIB


def x_values(records: list[dict[str, Any]], x: str) -> list[float]:
    """Each record's place on the x axis: its epoch, or its ``elapsed_seconds`` (else the sum
    of the epochs' seconds so far)."""
    if x == "epoch":
        return [r["epoch"] for r in records]
    total, values = 0.0, []
    for record in records:
        total += record.get("epoch_seconds", 0.0)
        values.append(record.get("elapsed_seconds", total))
    return values


def draw(runs: dict[str, list[dict[str, Any]]], x: str = "epoch") -> bytes:
    """The PNG of the four panels for ``runs`` (label -> records), over ``x`` (``X_AXES``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    loss, f1, seconds, traffic = axes.flat
    for index, (label, records) in enumerate(runs.items()):
        colour = f"C{index % 10}"
        epochs = x_values(records, x)
        loss.plot(epochs, [r["loss"] for r in records], color=colour, label=label)
        for split, style in SPLIT_STYLES.items():
            scored = [k for k, r in enumerate(records) if f"{split}_micro_f1" in r]
            f1.plot([epochs[k] for k in scored], [records[k][f"{split}_micro_f1"] for k in scored],
                    style, color=colour, label=f"{label} {split}")
        seconds.plot(epochs, [r.get("epoch_seconds", float("nan")) for r in records],
                     color=colour, label=label)
        traffic.plot(epochs, [client_mib(r) for r in records], color=colour, label=label)
    for axis, title, unit in ((loss, "training loss", "loss"),
                              (f1, "micro-F1 (train --, val :, test -)", "micro-F1"),
                              (seconds, "epoch time (slowest rank)", "seconds"),
                              (traffic, "bytes per client rank (sent + received)", "MiB")):
        axis.set_title(title)
        axis.set_xlabel(X_AXES[x])
        if x == "epoch":
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel(unit)
        axis.grid(alpha=0.3)
    loss.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def labels_for(run_dirs: list[Path]) -> list[str]:
    """Each run's folder name; the full path where two runs share one."""
    names = [p.name or str(p) for p in run_dirs]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(run_dirs, names)]


def is_png(path: Path) -> bool:
    """Whether ``path`` holds a PNG (a plot this program drew before may be drawn again)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
    except OSError:
        return False


def plot_runs(run_dirs: list[Path], out: Path | None = None, from_epoch: int = 1,
              x: str = "epoch") -> Path:
    """Draw ``run_dirs`` from epoch ``from_epoch`` on, over ``x`` (``X_AXES``), into ``out``
    (default: RUN_DIR/metrics.png for one run, metrics.png in the working directory for
    several); returns the path written. ProtectedPathError when ``out`` would replace a file
    of a run or enter a shard directory (``fgl_common.protected``)."""
    if out is None:
        out = run_dirs[0] / "metrics.png" if len(run_dirs) == 1 else Path("metrics.png")
    check_output_file(out, "--out", is_own=is_png)
    runs = {}
    for label, path in zip(labels_for(run_dirs), run_dirs):
        records = read_metrics(path)
        seconds = x_values(records, "seconds")  # from the first epoch on, drawn or not
        runs[label] = [{**r, "elapsed_seconds": t} for r, t in zip(records, seconds)
                       if r["epoch"] >= from_epoch]
    write_bytes(out, draw(runs, x))
    return out


@dataclass(frozen=True)
class PlotArgs:
    """The command line of ``python -m mpifgl.plot``."""

    run_dirs: tuple[str, ...] = option(MISSING, "run directories of `python -m mpifgl.train`, "
                                                "drawn over each other", positional=True,
                                       nargs="+")
    out: str | None = option(None, "PNG to write; default: RUN_DIR/metrics.png for one run, "
                                   "metrics.png in the working directory for several")
    from_epoch: int = option(1, "draw the epochs from this one on (leave out the first epochs' "
                                "fall, to compare runs near convergence)")
    x: str = option("epoch", "the x axis: epoch, or seconds (training and evaluation since "
                             "training began: micro-F1 against time, to compare methods by time "
                             "to accuracy)", tuple(X_AXES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Draw loss, micro-F1 per split, epoch time and bytes per client over the "
                    "epochs of one or more runs (metrics.jsonl) into one PNG.")
    add_dataclass_arguments(parser, PlotArgs)
    args = dataclass_from_namespace(PlotArgs, parser.parse_args(argv))
    run_dirs = [Path(p) for p in args.run_dirs]
    if args.from_epoch < 1:
        parser.error(f"--from-epoch {args.from_epoch}: expected an epoch >= 1")
    try:
        out = plot_runs(run_dirs, Path(args.out) if args.out else None, args.from_epoch,
                        args.x)
    except (PlotError, ProtectedPathError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: wrote {out} ({len(run_dirs)} run{'s' if len(run_dirs) > 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
