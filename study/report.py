"""The study's report: CSV tables, PNG plots and report.md, from REPORT_DIR/plan.json and the run
directories under REPORT_DIR/runs (written by ``python -m study``).

    python -m study.report REPORT_DIR

Reads only files: it can be re-run at any time (also on a half-finished study: missing runs show
as gaps). Plain numpy + matplotlib (Agg backend): no torch, no MPI.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from data_prep.config import PARTITION_METHODS
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option
from fgl_common.protected import ProtectedPathError, check_output_directory

from mpifgl.bias import BiasError, disagreement, load_run_logits, mean_distance
from study.catalog import REFERENCE_METHOD, algo_of, label_of, methods_of
from study.rundir import read_json, read_metrics

# -- the paper's numbers (PubMed, 8 clients, random partition; Table 2 / 4 / 5, section 4) -------
PAPER_TABLE2_PUBMED = {"ours": 89.90, "ours-1gnn": 90.70, "centralized": 87.80,
                       "centralized-1gnn": 90.50, "graphsage": 90.10, "graphsaint": 89.20,
                       "fedavg": 87.70, "fedavg-nc": None, "bns": 90.20, "cagnet": 88.20,
                       "llcg": 89.20,
                       "fedsage-plus": 89.05}  # FedSAGE+: OOM on Reddit and ogbn-products
PAPER_TABLE2_OTHERS = {"ours": (95.54, 79.15), "ours-1gnn": (96.12, 76.28),
                       "centralized": (93.30, 75.64), "graphsage": (95.40, 78.50),
                       "graphsaint": (96.60, 79.08), "fedavg": (91.86, 71.51),
                       "bns": (96.30, 78.66), "cagnet": (94.13, 75.36),
                       "llcg": (96.47, 74.00)}  # Reddit, products
PAPER_TABLE5_PUBMED = {"ours-full": 87.60, "ours-star": 89.70, "ours": 90.10}
PAPER_CROSS_EDGES = {4: 74.86, 8: 87.33, 16: 93.56, 32: 96.68}  # Figure 3, percent
# Table 3 (tab:time cost), PubMed: (training seconds per epoch, memory MB per client); the
# paper's CAGNET is its 1.5D algorithm.
PAPER_TABLE3_PUBMED = {("cagnet", 4): (0.3063, 20.20), ("fedavg", 4): (0.0937, 10.65),
                       ("ours", 4): (0.0526, 3.50), ("cagnet", 8): (0.4078, 10.10),
                       ("fedavg", 8): (0.0994, 5.46), ("ours", 8): (0.1701, 1.75)}
# Section names of older plans (the time-cost table was once called table 4).
LEGACY_SECTIONS = {"table4": "table3"}
# Time to accuracy: the target is the centralized run's best validation micro-F1 less this.
TARGET_MARGIN = 0.01
# Table 5's columns: (sampling, 1/p normalisation) of each ablation method.
ABLATION_COLUMNS = {"ours-full": ("no", "no"), "ours-star": ("yes", "no"), "ours": ("yes", "yes")}


@dataclass
class RunRow:
    """One run, flattened: the line of runs.csv."""

    key: str
    sections: str
    dataset: str
    method: str
    partition: str
    num_clients: int
    seed: int
    epochs: int
    lr: float
    tag: str
    status: str  # done | failed | unavailable | missing
    message: str = ""
    test_f1: float = math.nan
    best_val_f1: float = math.nan
    best_epoch: int = 0
    wall_seconds: float = math.nan  # whole subprocess, start-up included
    epoch_seconds: float = math.nan  # mean over epochs after the first (warm-up)
    compute_seconds: float = math.nan  # training compute per epoch (max over ranks)
    comm_seconds: float = math.nan  # training communication per epoch (max over ranks)
    client_mb_per_epoch: float = math.nan  # bytes sent + received per client per epoch, mean
    server_mb_per_epoch: float = math.nan
    client_peak_rss_mb: float = math.nan  # max over clients (process RSS, libraries included)
    client_tensor_mb: float = math.nan  # mean over clients of final.json's tensor bytes
    target_val_f1: float = math.nan  # the dataset's centralized best val - TARGET_MARGIN
    epoch_to_target: float = math.nan  # first epoch whose val micro-F1 reached it
    seconds_to_target: float = math.nan  # training + evaluation seconds to that epoch
    local_bias: float = math.nan
    disagreement: float = math.nan  # share of nodes predicted otherwise than the reference
    noise_floor: float = math.nan  # reference vs centralized with another seed
    same_init_floor: float = math.nan  # reference vs centralized, same initial weights
    cross_edge_fraction: float = math.nan


def summarize_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per-epoch means (first epoch left out when there are more: it carries warm-up)."""
    if not records:
        return {}
    steady = records[1:] if len(records) > 1 else records
    out = {k: float(np.mean([r[k] for r in steady]))
           for k in ("epoch_seconds", "compute_seconds", "comm_seconds") if k in steady[0]}
    sent = np.asarray([r.get("bytes_sent", [0]) for r in steady], dtype=np.float64)
    received = np.asarray([r.get("bytes_received", [0]) for r in steady], dtype=np.float64)
    moved = (sent + received) / 2 ** 20  # [epochs, ranks]
    if moved.shape[1] > 1:
        out["client_mb_per_epoch"] = float(moved[:, 1:].mean())
        out["server_mb_per_epoch"] = float(moved[:, 0].mean())
    else:
        out["client_mb_per_epoch"] = out["server_mb_per_epoch"] = 0.0
    rss = np.asarray([r.get("peak_rss_mb", [math.nan]) for r in records], dtype=np.float64)
    out["client_peak_rss_mb"] = float(np.nanmax(rss[:, 1:] if rss.shape[1] > 1 else rss))
    return out


def client_tensor_mb(final: dict[str, Any]) -> float:
    """Mean over the client ranks of the bytes their tensors take (final.json's
    ``rank_reports``, by kind: mpifgl.tensor_memory), MB; nan where the run has none."""
    reports = final.get("rank_reports") or []
    clients = reports[1:] if len(reports) > 1 else reports
    totals = [sum(r["tensor_bytes"].values()) for r in clients if r.get("tensor_bytes")]
    return float(np.mean(totals)) / 2 ** 20 if totals else math.nan


def time_to_target(records: list[dict[str, Any]], target: float) -> tuple[int, float] | None:
    """(epoch, seconds) of the first evaluation whose validation micro-F1 reached ``target``;
    seconds: the run's ``elapsed_seconds`` then (training and evaluation since training
    began), or the sum of ``epoch_seconds`` for runs that predate it. None: never reached."""
    total = 0.0
    for record in records:
        total += record.get("epoch_seconds", 0.0)
        if record.get("val_micro_f1", -1.0) >= target:
            return int(record["epoch"]), float(record.get("elapsed_seconds", total))
    return None


def attach_time_to_target(rows: list[RunRow], root: Path) -> None:
    """Every finished run's time to its dataset and partition's target: the mean best
    validation micro-F1 of the study's centralized runs there, less TARGET_MARGIN."""
    best: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row.method == REFERENCE_METHOD and not row.tag and row.status == "done":
            best.setdefault((row.dataset, row.partition), []).append(row.best_val_f1)
    for row in rows:
        scores = best.get((row.dataset, row.partition))
        if row.status != "done" or not scores:
            continue
        row.target_val_f1 = float(np.mean(scores)) - TARGET_MARGIN
        reached = time_to_target(read_metrics(root / "runs" / row.key), row.target_val_f1)
        if reached is not None:
            row.epoch_to_target, row.seconds_to_target = reached


def convergence_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative training wall seconds, test micro-F1) per evaluated epoch."""
    records = read_metrics(run_dir)
    seconds = np.cumsum([r.get("epoch_seconds", 0.0) for r in records])
    keep = [i for i, r in enumerate(records) if "test_micro_f1" in r]
    return seconds[keep], np.asarray([records[i]["test_micro_f1"] for i in keep])


def collect_rows(root: Path, plan: dict[str, Any]) -> list[RunRow]:
    rows = []
    bias_cache: dict[str, Any] = {}
    unavailable = plan.get("unavailable", {})
    for entry in plan["runs"]:
        run_dir = root / "runs" / entry["key"]
        sections = [LEGACY_SECTIONS.get(name, name) for name in entry["sections"]]
        row = RunRow(entry["key"], "+".join(sections), entry["dataset"], entry["method"],
                     entry["partition"], entry["num_clients"], entry["seed"], entry["epochs"],
                     entry["lr"], entry.get("tag", ""), "missing")
        final = read_json(run_dir / "final.json")
        failed = read_json(run_dir / "FAILED.json")
        algo = algo_of(entry["method"])
        if final is not None:
            row.status = "done"
            row.test_f1 = float(final.get("test_micro_f1", math.nan))
            row.best_val_f1 = float(final.get("best_val_micro_f1", math.nan))
            row.best_epoch = int(final.get("best_epoch", 0))
            for name, value in summarize_metrics(read_metrics(run_dir)).items():
                setattr(row, name, value)
            row.client_tensor_mb = client_tensor_mb(final)
            driver = read_json(run_dir / "driver.json") or {}
            row.wall_seconds = float(driver.get("wall_seconds", math.nan))
        elif failed is not None:
            row.status, row.message = "failed", failed.get("reason", "")
            tail = failed.get("stderr_tail") or []
            if tail:
                row.message += ": " + tail[-1]
        elif algo in unavailable:
            row.status, row.message = "unavailable", unavailable[algo]
        elif plan.get("outcomes", {}).get(entry["key"], {}).get("status") == "budget":
            row.status, row.message = "budget", "not run: over the study's time budget"
        manifest = read_json(root / "shards" / entry["shard_name"] / "manifest.json")
        if manifest:
            row.cross_edge_fraction = float(manifest.get("cross_edge_fraction", math.nan))
        if row.status == "done" and entry.get("reference"):
            _attach_bias(row, root, entry, manifest, bias_cache)
        rows.append(row)
    attach_time_to_target(rows, root)
    return rows


def _attach_bias(row: RunRow, root: Path, entry: dict, manifest: dict | None,
                 cache: dict[str, Any]) -> None:
    def logits(key: str):
        if key not in cache:
            try:
                cache[key] = load_run_logits(root / "runs" / key).logits
            except BiasError:
                cache[key] = None
        return cache[key]

    run, ref = logits(entry["key"]), logits(entry["reference"])
    if run is None or ref is None or run.shape != ref.shape:
        return
    row.local_bias = mean_distance(run, ref)
    row.disagreement = disagreement(run, ref)
    if entry.get("noise_reference"):
        noise = logits(entry["noise_reference"])
        if noise is not None and noise.shape == ref.shape:
            row.noise_floor = mean_distance(noise, ref)
    if entry.get("same_init_reference"):
        noise = logits(entry["same_init_reference"])
        if noise is not None and noise.shape == ref.shape:
            row.same_init_floor = mean_distance(noise, ref)


# -- aggregation --------------------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[float, float, int]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan, 0
    return float(np.mean(finite)), float(np.std(finite)), len(finite)


def fmt(mean: float, std: float | None = None, n: int | None = None, scale: float = 100.0,
        digits: int = 2) -> str:
    if math.isnan(mean):
        return "-"
    text = f"{mean * scale:.{digits}f}"
    if std is not None and n is not None and n > 1:
        text += f" ± {std * scale:.{digits}f}"
    return text


def select(rows: list[RunRow], section: str, **match: Any) -> list[RunRow]:
    return [r for r in rows if section in r.sections.split("+")
            and all(getattr(r, k) == v for k, v in match.items())]


def status_note(rows: list[RunRow]) -> str:
    if not rows:
        return "not planned"
    if any(r.status == "done" for r in rows):
        return ""
    reasons = {r.status + (f" ({r.message[:80]})" if r.message else "") for r in rows}
    return "; ".join(sorted(reasons))


def write_csv(path: Path, header: list[str], lines: list[list[Any]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(lines)


# -- sections -----------------------------------------------------------------------------------
def table2(rows: list[RunRow], out: Path, datasets: list[str], methods: list[str]) -> list[str]:
    """Test micro-F1 per method and dataset, each dataset followed by the time to target: the
    mean seconds (training and evaluation) to the first epoch whose validation micro-F1 reached
    the centralized run's best less TARGET_MARGIN, over the seeds that reached it."""
    header = ["method"] + [c for d in datasets for c in (d, f"{d}: s to target")] + \
        ["paper PubMed", "paper Reddit", "paper products"]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines = []
    for method in methods:
        cells, csv_cells = [], []
        for dataset in datasets:
            runs = select(rows, "table2", dataset=dataset, method=method)
            mean, std, n = mean_std([r.test_f1 for r in runs])
            note = status_note(runs)
            cells.append(fmt(mean, std, n) if n else (note.split(" (")[0] or "-"))
            cells.append(target_cell(runs))
            seconds, _, reached = mean_std([r.seconds_to_target for r in runs])
            csv_cells += [mean, std, n, seconds, reached]
        others = PAPER_TABLE2_OTHERS.get(method, (None, None))
        paper = [PAPER_TABLE2_PUBMED.get(method), *others]
        md.append(f"| {label_of(method)} | " + " | ".join(cells) + " | " +
                  " | ".join("-" if p is None else f"{p:.2f}" for p in paper) + " |")
        lines.append([method, *csv_cells, *paper])
    write_csv(out / "table2.csv",
              ["method", *[f"{d}_{s}" for d in datasets for s in
                           ("mean", "std", "n", "seconds_to_target", "n_reached_target")],
               "paper_pubmed", "paper_reddit", "paper_products"], lines)
    return md


def target_cell(runs: list[RunRow]) -> str:
    """'12.3 (e 40)': mean seconds and epoch to target over the runs that reached it, with
    how many did when not all; 'not reached' or '-' (no target: no centralized run)."""
    done = [r for r in runs if r.status == "done" and not math.isnan(r.target_val_f1)]
    reached = [r for r in done if not math.isnan(r.seconds_to_target)]
    if not done:
        return "-"
    if not reached:
        return "not reached"
    seconds = float(np.mean([r.seconds_to_target for r in reached]))
    epoch = float(np.mean([r.epoch_to_target for r in reached]))
    share = "" if len(reached) == len(done) else f", {len(reached)} of {len(done)}"
    return f"{seconds:.2f} (e {epoch:.0f}{share})"


def save_figure(fig, plt, out: Path, name: str, caption: str) -> list[str]:
    """Write ``out/name.png`` and return the Markdown lines that show it."""
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return ["", f"![{caption}]({name}.png)"]

def per_dataset(section: str, runs: list[RunRow], out: Path, header: list[str],
                draw: Callable[[str, list[RunRow], str, list[list]], list[str]]) -> list[str]:
    """A figure's Markdown with one table and plot per dataset (``section``.png for the first,
    ``section``-<dataset>.png for the others; a mean over datasets would mix graphs of other
    accuracies and logit scales) and ``section``.csv with a dataset column. ``draw(dataset,
    its runs, png name, csv rows)`` writes one dataset's plot, appends its CSV rows and returns
    its table."""
    datasets = list(dict.fromkeys(r.dataset for r in runs if r.method != REFERENCE_METHOD))
    md, lines = [], []
    for k, dataset in enumerate(datasets):
        if len(datasets) > 1:
            md += [f"### {dataset}", ""]
        md += draw(dataset, [r for r in runs if r.dataset == dataset],
                   section if k == 0 else f"{section}-{dataset}", lines)
        md.append("")
    write_csv(out / f"{section}.csv", ["dataset", *header], lines)
    return md[:-1]


def figure3(rows: list[RunRow], out: Path, plt) -> list[str]:
    runs = select(rows, "fig3")
    if not any(r.method != REFERENCE_METHOD for r in runs):
        return ["(not run)"]
    return per_dataset("fig3", runs, out, ["clients", "cross_edge_fraction", "method", "f1_mean",
                                           "f1_std", "bias_mean", "bias_std", "noise_floor",
                                           "same_init_floor"],
                       lambda d, mine, name, lines: _figure3_of(d, mine, out, plt, name, lines))


def _figure3_of(dataset: str, runs: list[RunRow], out: Path, plt, name: str,
                csv_lines: list[list]) -> list[str]:
    """Figure 3 of one dataset: its table (returned), its figure ``name``.png and its rows of
    fig3.csv (appended to ``csv_lines``)."""
    distributed = [r for r in runs if r.method != REFERENCE_METHOD]
    counts = sorted({r.num_clients for r in distributed})
    methods = [m for m in methods_of("fig3") if any(r.method == m for r in runs)]
    lines, md = [], ["| clients | cross-client edges (paper) | " +
                     " | ".join(f"{label_of(m)} F1 / bias" for m in methods) +
                     " | noise floor: other seed / same init |",
                     "|" + "---|" * (3 + len(methods))]
    for m_clients in counts:
        at = [r for r in distributed if r.num_clients == m_clients]
        cross = next((r.cross_edge_fraction for r in at if not math.isnan(r.cross_edge_fraction)),
                     math.nan)
        noise = mean_std([r.noise_floor for r in at])[0]
        same_init = mean_std([r.same_init_floor for r in at])[0]
        cells = []
        for method in methods:
            mine = [r for r in at if r.method == method]
            f1 = mean_std([r.test_f1 for r in mine])
            bias = mean_std([r.local_bias for r in mine])
            cells.append(f"{fmt(*f1)} / {fmt(*bias, scale=1, digits=3)}" if f1[2]
                         else status_note(mine).split(" (")[0])
            lines.append([m_clients, cross, method, f1[0], f1[1], bias[0], bias[1], noise,
                          same_init])
        paper = PAPER_CROSS_EDGES.get(m_clients)
        md.append(f"| {m_clients} | {fmt(cross)}% ({paper if paper else '-'}%) | " +
                  " | ".join(cells) + f" | {fmt(noise, scale=1, digits=3)} / "
                  f"{fmt(same_init, scale=1, digits=3)} |")
    csv_lines.extend([dataset, *line] for line in lines)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in methods:
        xs = [c for c in counts if any(l[0] == c and l[2] == method and not math.isnan(l[3])
                                       for l in lines)]
        f1 = [next(l[3] for l in lines if l[0] == c and l[2] == method) * 100 for c in xs]
        bias = [next(l[5] for l in lines if l[0] == c and l[2] == method) for c in xs]
        axes[0].plot(xs, f1, marker="o", label=label_of(method))
        axes[1].plot(xs, bias, marker="o", label=label_of(method))
    noise = [l[7] for l in lines if not math.isnan(l[7])]
    if noise:
        axes[1].axhline(float(np.mean(noise)), color="gray", ls="--",
                        label="noise floor (other seed)")
    same_init = [l[8] for l in lines if not math.isnan(l[8])]
    if same_init:
        axes[1].axhline(float(np.mean(same_init)), color="gray", ls=":",
                        label="noise floor (same initial weights)")
    for ax, title in zip(axes, ("test micro-F1 (%)", "local bias (mean L2 to centralized)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("clients (random partition)")
        ax.set_title(title)
        ax.legend()
    return md + save_figure(fig, plt, out, name, f"Figure 3, {dataset}")


def figure4(rows: list[RunRow], root: Path, out: Path, plt) -> list[str]:
    runs = [r for r in select(rows, "fig4") if r.method != REFERENCE_METHOD]
    if not runs:
        return ["(not run)"]
    return per_dataset("fig4", runs, out, ["method", "partition", "f1_mean", "f1_std",
                                           "bias_mean", "bias_std", "disagreement_mean",
                                           "disagreement_std"],
                       lambda d, mine, name, lines: _figure4_of(d, mine, root, out, plt, name,
                                                                lines))


# the paper calls random "iid" and label-skew "non-iid"; figure 4's columns follow data_prep's order
PARTITION_LABEL = {"random": "iid", "label-skew": "non-iid"}


def partition_label(partition: str) -> str:
    return PARTITION_LABEL.get(partition, partition)


def _figure4_of(dataset: str, runs: list[RunRow], root: Path, out: Path, plt, name: str,
                csv_lines: list[list]) -> list[str]:
    """Figure 4 of one dataset: its table (returned), its figure ``name``.png and its rows of
    fig4.csv (appended to ``csv_lines``). One column per measure and partition run."""
    methods = [m for m in methods_of("fig4") if any(r.method == m for r in runs)]
    partitions = [p for p in PARTITION_METHODS if any(r.partition == p for r in runs)]
    heads = [f"{partition_label(p)} {measure}" for measure in ("F1", "bias", "disagreement")
             for p in partitions]
    md = ["| method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    lines = []
    for method in methods:
        cell = {}
        for partition in partitions:
            mine = [r for r in runs if r.method == method and r.partition == partition]
            cell[partition] = (mean_std([r.test_f1 for r in mine]),
                               mean_std([r.local_bias for r in mine]), status_note(mine),
                               mean_std([r.disagreement for r in mine]))
            lines.append([method, partition, *cell[partition][0][:2], *cell[partition][1][:2],
                          *cell[partition][3][:2]])
        md.append(f"| {label_of(method)} | " + " | ".join(
            fmt(*cell[p][0]) if cell[p][0][2] else cell[p][2].split(" (")[0]
            for p in partitions) + " | " + " | ".join(
            fmt(*cell[p][1], scale=1, digits=3) for p in partitions) + " | "
            + " | ".join(fmt(*cell[p][3]) + ("%" if cell[p][3][2] else "")
                         for p in partitions) + " |")
    csv_lines.extend([dataset, *line] for line in lines)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.7 / len(partitions)
    x = np.arange(len(methods))
    for k, partition in enumerate(partitions):
        f1 = [next((l[2] for l in lines if l[0] == m and l[1] == partition), math.nan) * 100
              for m in methods]
        bias = [next((l[4] for l in lines if l[0] == m and l[1] == partition), math.nan)
                for m in methods]
        label = (f"{partition_label(partition)} ({partition})"
                 if partition in PARTITION_LABEL else partition)
        offset = (k - (len(partitions) - 1) / 2) * width
        axes[0].bar(x + offset, f1, width, label=label)
        axes[1].bar(x + offset, bias, width, label=label)
    for ax, title in zip(axes[:2], ("test micro-F1 (%)", "local bias")):
        ax.set_xticks(x, [label_of(m) for m in methods], fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    styles = dict(zip(PARTITION_METHODS, ("-", "--", ":", "-.", (0, (1, 3)))))
    for r in runs:
        if r.status != "done":
            continue
        t, f1 = convergence_curve(root / "runs" / r.key)
        axes[2].plot(t, f1 * 100, ls=styles.get(r.partition, "-"),
                     label=f"{label_of(r.method)} {partition_label(r.partition)} s{r.seed}")
    axes[2].set_xlabel("training wall seconds")
    axes[2].set_title("convergence: test micro-F1 (%)")
    axes[2].legend(fontsize=7)
    return md + save_figure(fig, plt, out, name, f"Figure 4, {dataset}")


def table3(rows: list[RunRow], out: Path) -> list[str]:
    runs = select(rows, "table3")
    if not runs:
        return ["(not run)"]
    md = ["| method | clients | epoch s | compute s | comm s | MB / client / epoch | "
          "MB server / epoch | tensors / client MB | peak RSS / client MB | "
          "paper PubMed s, MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for method in methods_of("table3"):
        for clients in sorted({r.num_clients for r in runs}):
            mine = [r for r in runs if r.method == method and r.num_clients == clients]
            if not mine:
                continue
            values = [mean_std([getattr(r, name) for r in mine])[0] for name in
                      ("epoch_seconds", "compute_seconds", "comm_seconds", "client_mb_per_epoch",
                       "server_mb_per_epoch", "client_tensor_mb", "client_peak_rss_mb")]
            paper = PAPER_TABLE3_PUBMED.get((method, clients))
            note = status_note(mine)
            cells = [f"{v:.4f}" if not math.isnan(v) else "-" for v in values[:3]] + \
                    [f"{v:.2f}" if not math.isnan(v) else "-" for v in values[3:]]
            if note:
                cells = [note.split(" (")[0]] + cells[1:]
            md.append(f"| {label_of(method)} | {clients} | " + " | ".join(cells) +
                      f" | {f'{paper[0]}, {paper[1]}' if paper else '-'} |")
            lines.append([method, clients, *values])
    write_csv(out / "table3.csv", ["method", "clients", "epoch_seconds", "compute_seconds",
                                   "comm_seconds", "client_mb_per_epoch", "server_mb_per_epoch",
                                   "client_tensor_mb", "client_peak_rss_mb"], lines)
    return md


def table5(rows: list[RunRow], out: Path, datasets: list[str]) -> list[str]:
    runs = select(rows, "table5")
    if not runs:
        return ["(not run)"]
    datasets = [d for d in datasets if any(r.dataset == d for r in runs)]
    md = ["| method | sampling | normalisation | " + " | ".join(datasets) + " | paper PubMed |",
          "|" + "---|" * (4 + len(datasets))]
    lines = []
    for method in methods_of("table5"):
        sampling, norm = ABLATION_COLUMNS[method]
        cells = []
        for dataset in datasets:
            mine = [r for r in runs if r.method == method and r.dataset == dataset]
            mean, std, n = mean_std([r.test_f1 for r in mine])
            cells.append(fmt(mean, std, n) if n else status_note(mine).split(" (")[0])
            lines.append([method, dataset, mean, std, n])
        md.append(f"| {label_of(method)} | {sampling} | {norm} | " + " | ".join(cells) +
                  f" | {PAPER_TABLE5_PUBMED[method]:.2f} |")
    write_csv(out / "table5.csv", ["method", "dataset", "f1_mean", "f1_std", "n"], lines)
    return md


def figure5(rows: list[RunRow], out: Path, plt) -> list[str]:
    runs = sorted((r for r in select(rows, "fig5") if r.status == "done"),
                  key=lambda r: int(r.tag[1:]) if r.tag[1:].isdigit() else 0)
    if not runs:
        return ["(not run)" if not select(rows, "fig5") else
                "(no finished run: " + status_note(select(rows, "fig5")) + ")"]
    md = ["| steps / epoch | compute s / epoch | comm s / epoch | epoch s | test F1 |",
          "|---|---|---|---|---|"]
    lines = []
    for r in runs:
        steps = int(r.tag[1:])
        md.append(f"| {steps} | {r.compute_seconds:.4f} | {r.comm_seconds:.4f} | "
                  f"{r.epoch_seconds:.4f} | {fmt(r.test_f1)} |")
        lines.append([r.dataset, steps, r.compute_seconds, r.comm_seconds, r.epoch_seconds,
                      r.test_f1])
    write_csv(out / "fig5.csv", ["dataset", "steps_per_epoch", "compute_seconds", "comm_seconds",
                                 "epoch_seconds", "test_f1"], lines)
    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(len(lines))
    ax.bar(x, [l[2] for l in lines], label="compute")
    ax.bar(x, [l[3] for l in lines], bottom=[l[2] for l in lines], label="communication")
    ax.set_xticks(x, [str(l[1]) for l in lines])
    ax.set_xlabel("steps per epoch (sample size = nodes per epoch / steps)")
    ax.set_ylabel("training seconds per epoch")
    ax.legend()
    return md + save_figure(fig, plt, out, "fig5", "Figure 5")


def figure6(rows: list[RunRow], root: Path, out: Path, plt) -> list[str]:
    runs = [r for r in select(rows, "fig6") if r.status == "done"]
    if not runs:
        return ["(not run)"]
    fig, ax = plt.subplots(figsize=(6, 4))
    md = ["| run | test F1 | seconds to 95% of its best test F1 | total training s |",
          "|---|---|---|---|"]
    for r in runs:
        t, f1 = convergence_curve(root / "runs" / r.key)
        ax.plot(t, f1 * 100, label=f"{label_of(r.method)} ({r.dataset}, s{r.seed})")
        reach = t[np.argmax(f1 >= 0.95 * f1.max())] if f1.size else math.nan
        md.append(f"| {label_of(r.method)} {r.dataset} s{r.seed} | {fmt(r.test_f1)} | "
                  f"{reach:.2f} | {t[-1] if t.size else math.nan:.2f} |")
    ax.set_xlabel("training wall seconds")
    ax.set_ylabel("test micro-F1 (%)")
    ax.legend(fontsize=8)
    return md + save_figure(fig, plt, out, "fig6", "Figure 6")


# -- the report ---------------------------------------------------------------------------------
def plan_section(plan: dict[str, Any], rows: list[RunRow]) -> list[str]:
    config = plan.get("config", {})
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    sessions = plan.get("sessions", [])
    wall = sum(s.get("wall_seconds", 0.0) for s in sessions)
    run_seconds = sum(r.wall_seconds for r in rows if not math.isnan(r.wall_seconds))
    minibatch = sorted({f"{r.method} {r.dataset} {r.epochs}" for r in rows
                        if algo_of(r.method) in ("graphsage", "graphsaint")})
    lines = [
        f"- datasets: {', '.join(config.get('datasets', []))}; seeds {config.get('seeds')}; "
        f"Table 2/5 epochs {config.get('epochs')}; lr "
        + ("searched in {0.1, 0.01, 0.001} on seed 0 by best val" if config.get("lr_search")
           else f"fixed at {config.get('lr')}") + ".",
        ("- GraphSAGE / GraphSAINT epochs chosen for about as many optimizer steps as the "
         "others (mini-batch steps per epoch): " + ", ".join(minibatch) + "."
         if config.get("equal_steps", False) and minibatch else
         "- GraphSAGE / GraphSAINT run the same epochs as the others."),
        f"- figures 3-6 and table 3 on {', '.join(config.get('figure_datasets', []))} with seeds "
        f"{config.get('figure_seeds')}, {config.get('figure_epochs')} epochs; figure 3 clients "
        f"{config.get('client_counts')}; table 3 clients {config.get('overhead_clients')}; "
        f"figure 5: steps {config.get('step_lengths')} x sample size = "
        f"{config.get('fig5_nodes_fraction')} n / steps, {config.get('fig5_epochs')} epochs.",
        "- Table 2 / Figure 3 / Figure 4 / Table 3 use 8 clients unless stated, random "
        "partition with partition seed 0; the training seed varies. Every run writes its "
        "logits; local bias is measured against the centralized GCN with the same seed, the "
        "noise floors are centralized seed s vs seed s+1 (other initial weights and dropout) "
        "and vs seed s+1 with --init-seed s (same initial weights as the reference and as "
        "every distributed run of seed s; dropout differs): the like-for-like floor. "
        "Figure 4's disagreement is the share of nodes whose predicted class differs from "
        "that reference's, which the logits' scale does not move.",
        f"- runs planned: {len(rows)} ({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))});"
        f" estimated by the cost model {plan.get('estimated_seconds', 0) / 60:.1f} min; "
        f"measured: {run_seconds / 60:.1f} min in training subprocesses, "
        f"{wall / 60:.1f} min of driver wall time over {len(sessions)} session(s).",
    ]
    if plan.get("unavailable"):
        lines.append("- methods not importable when the study ran (their cells show "
                     "'unavailable'): " + "; ".join(f"`{a}`: {e}" for a, e in
                                                     sorted(plan["unavailable"].items())))
    if plan.get("lr_choice"):
        lines.append("- lr chosen: " + ", ".join(f"{k} {v:g}" for k, v in
                                                  sorted(plan["lr_choice"].items())))
    return lines


def write_report(root: Path) -> Path:
    """Write runs.csv, the section CSVs, the PNGs and report.md into ``root``; never into a
    run or shard directory (ProtectedPathError: ``fgl_common.protected``)."""
    check_output_directory(root, "REPORT_DIR", None)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = read_json(root / "plan.json")
    if plan is None:
        raise FileNotFoundError(f"{root / 'plan.json'}: missing or unreadable; run "
                                f"`python -m study --out {root}` first")
    rows = collect_rows(root, plan)
    write_csv(root / "runs.csv", [f.name for f in fields(RunRow)],
              [list(asdict(r).values()) for r in rows])
    config = plan.get("config", {})
    datasets = list(config.get("datasets") or sorted({r.dataset for r in rows}))
    md = ["# mpifgl study report", "",
          "Reproduces the experiments of *Tackling the Local Bias in Federated Graph Learning* "
          "(section 4, appendix E) on the datasets available offline. The paper's numbers are "
          "for PubMed / Reddit / ogbn-products, which are not on this machine: they are shown "
          "for orientation, not as like-for-like targets. F1 = test micro-F1 (%) at the best "
          "validation epoch, mean ± std over seeds.", "", "## Plan", "",
          *plan_section(plan, rows), "",
          "## Table 2: test micro-F1, 8 clients, random partition", "",
          "Beside each dataset, the time to target: seconds of training and evaluation (the "
          "server's clock) to the first epoch whose validation micro-F1 reached the study's "
          f"centralized GCN's best validation micro-F1 less {TARGET_MARGIN * 100:g} point on "
          "that dataset and partition (mean over the seeds that reached it; e = that epoch).",
          "", *table2(rows, root, datasets, list(methods_of("table2"))), "",
          "## Figure 3: clients vs F1 and local bias (random partitions)", "",
          *figure3(rows, root, plt), "",
          "## Figure 4: the partitions side by side (iid = random, non-iid = label-skew), "
          "8 clients", "",
          *figure4(rows, root, root, plt), "",
          "## Table 3: per-epoch training cost per client", "",
          "Seconds are training time per epoch (evaluation excluded from compute/comm; `epoch s` "
          "includes the full-graph evaluation), max over ranks, mean over epochs after the "
          "first. MB = bytes sent + received by one client rank per epoch (training and "
          "evaluation exchanges). Tensors = what a client's tensors take (features, adjacency, "
          "autograd's saved activations, buffers, parameters: final.json's rank_reports), as "
          "the paper counts memory; peak RSS is the whole client process (Python, torch and "
          "MPI included), dominated by a ~300 MB constant. CAGNET is the paper's 1.5D "
          "algorithm (replication 2) beside its 1D one, with our GCN layer.", "",
          *table3(rows, root), "",
          "## Table 5: ablation", "", *table5(rows, root, datasets), "",
          "## Figure 5: step length vs compute / communication (8 clients)", "",
          *figure5(rows, root, plt), "",
          "## Figure 6: convergence of ours vs ours-full", "", *figure6(rows, root, root, plt),
          "", "## Runs that did not finish", ""]
    bad = [r for r in rows if r.status not in ("done",)]
    md += ([f"- `{r.key}`: {r.status} {r.message[:200]}" for r in bad] or ["none"])
    md += ["", "All runs: `runs.csv`; per-section data: `table2.csv`, `fig3.csv`, `fig4.csv`, "
           "`table3.csv`, `table5.csv`, `fig5.csv`."]
    path = root / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


@dataclass(frozen=True)
class ReportArgs:
    """The command line of ``python -m study.report``."""

    report_dir: Path = option(MISSING, "the --out directory of `python -m study`",
                              positional=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.report",
                                     description="rewrite REPORT_DIR's report from the runs there")
    add_dataclass_arguments(parser, ReportArgs)
    report_dir = dataclass_from_namespace(ReportArgs, parser.parse_args(argv)).report_dir
    try:
        print(write_report(report_dir))
    except (FileNotFoundError, ProtectedPathError) as exc:
        print(f"study.report: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
