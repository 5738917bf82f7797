"""The study's report, written from fake run directories (no training is launched)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from study.config import StudyConfig
from study.plan import build_plan
from study.report import collect_rows, summarize_metrics, write_report
from study.runner import failed_runs

pytestmark = pytest.mark.usefixtures("matplotlib_fonts")  # the report draws figures


# -- report from fake run directories -----------------------------------------------------------
def _fake_run(root: Path, key: str, f1: float, logits: np.ndarray, ranks: int = 3,
              epochs: int = 3) -> None:
    run = root / "runs" / key
    run.mkdir(parents=True)
    (run / "final.json").write_text(json.dumps({"test_micro_f1": f1, "best_val_micro_f1": f1,
                                                "best_epoch": 2, "dataset": "cora"}))
    (run / "config.json").write_text(json.dumps({"shards": "", "seed": 0}))
    lines = [json.dumps({"epoch": e, "loss": 1.0, "test_micro_f1": f1 * e / epochs,
                         "val_micro_f1": f1, "train_micro_f1": f1, "epoch_seconds": 0.5,
                         "compute_seconds": 0.3, "comm_seconds": 0.1,
                         "bytes_sent": [2 ** 20] * ranks, "bytes_received": [2 ** 20] * ranks,
                         "peak_rss_mb": [100.0 + r for r in range(ranks)]})
             for e in range(1, epochs + 1)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "driver.json").write_text(json.dumps({"wall_seconds": 7.0}))
    np.save(run / "logits.npy", logits)


def test_report_from_fake_runs(tmp_path, monkeypatch):
    config = StudyConfig(datasets=("cora",), out=tmp_path, seeds=(0, 1), figure_seeds=(0,),
                         client_counts=(4, 8), only=("table2", "fig3", "fig5"), epochs=100,
                         figure_epochs=100,
                         step_lengths=(1, 2))
    plan = build_plan(config, lambda d, m: 0.01, lambda d: 100)
    payload = plan.to_json()
    payload.update(config={"datasets": ["cora"], "seeds": [0, 1]},
                   unavailable={"bns": "ModuleNotFoundError: no bns"}, sessions=[])
    (tmp_path / "plan.json").write_text(json.dumps(payload))
    ref = np.zeros((4, 2))
    for key in plan.runs:
        if "bns" in key:
            continue
        if "graphsage" in key:
            (tmp_path / "runs" / key).mkdir(parents=True)
            (tmp_path / "runs" / key / "FAILED.json").write_text(json.dumps(
                {"reason": "timed out after 9 s", "stderr_tail": ["boom"]}))
            continue
        seed1 = key.endswith("s1")
        logits = ref + (0.5 if seed1 else 0.0)
        if "/ours-" in key:
            logits = ref + np.array([3.0, 4.0])  # distance 5 from the reference
        f1 = 0.8 if not seed1 else 0.9
        _fake_run(tmp_path, key, f1, logits)
    rows = {r.key: r for r in collect_rows(tmp_path, json.loads((tmp_path / "plan.json")
                                                                .read_text()))}
    ours = rows["cora/random-m8/ours-lr0.01-e100-s0"]
    assert ours.status == "done" and ours.local_bias == pytest.approx(5.0)
    assert ours.disagreement == 1.0  # [3, 4] over zeros: every node's class is 1, not 0
    assert ours.noise_floor == pytest.approx(math.sqrt(0.5))
    assert ours.client_mb_per_epoch == pytest.approx(2.0)
    assert rows["cora/random-m8/bns-lr0.01-e100-s0"].status == "unavailable"
    assert rows["cora/random-m8/graphsage-lr0.01-e100-s0"].status == "failed"
    path = write_report(tmp_path)
    text = path.read_text()
    # time to target: centralized's best val (0.8 and 0.9) less 1 point is 0.84, which ours'
    # seed 1 (val 0.9) reaches at epoch 1, after its 0.5 s, and its seed 0 (0.8) never does
    assert ours.target_val_f1 == pytest.approx(0.84) and math.isnan(ours.seconds_to_target)
    assert "| Ours (GCN) | 85.00 ± 5.00 | 0.50 (e 1, 1 of 2) | 89.90 | 95.54 | 79.15 |" in text
    assert "| BNS-GCN | unavailable |" in text and "| GraphSAGE | failed |" in text
    assert "80.00 / 5.000" in text  # figure 3: F1 / bias of ours
    for name in ("runs.csv", "table2.csv", "fig3.csv", "fig3.png", "fig5.csv", "fig5.png"):
        assert (tmp_path / name).is_file(), name
    table2 = (tmp_path / "table2.csv").read_text().splitlines()
    method, mean, std, n = table2[1].split(",")[:4]
    assert (method, int(n)) == ("ours", 2)
    assert (float(mean), float(std)) == pytest.approx((0.85, 0.05))
    # the study names the runs that did not finish, and its exit status says so
    failed = failed_runs(tmp_path)
    assert failed == {**{key: "timed out after 9 s" for key in plan.runs if "graphsage" in key},
                      **{key: "unavailable: --algo bns does not import" for key in plan.runs
                         if "bns" in key}}
    import study.__main__ as study_main
    monkeypatch.setattr(study_main, "write_report", lambda root: path)  # written above
    assert study_main.main(["--datasets", "cora", "--out", str(tmp_path), "--report-only"]) == 1


def test_table3_has_cagnet_and_the_secure_row(tmp_path):
    """Table 3 (the paper's time and memory table) runs CAGNET (1.5D and 1D) and ``ours`` with
    --secure, and reports each row with the clients' tensor memory from final.json."""
    config = StudyConfig(datasets=("cora",), out=tmp_path, seeds=(0,), figure_seeds=(0,),
                         client_counts=(4,), only=("table3",), epochs=100, figure_epochs=100,
                         step_lengths=(1,))
    plan = build_plan(config, lambda d, m: 0.01, lambda d: 100)
    assert any("/ours-secure-" in key for key in plan.runs)
    assert any("/cagnet-1d-" in key for key in plan.runs)
    payload = plan.to_json()
    payload.update(config={"datasets": ["cora"], "seeds": [0]}, unavailable={}, sessions=[])
    (tmp_path / "plan.json").write_text(json.dumps(payload))
    for key in plan.runs:
        _fake_run(tmp_path, key, 0.8, np.zeros((4, 2)), ranks=5)
    final = tmp_path / "runs" / "cora/random-m4/cagnet-lr0.01-e100-s0" / "final.json"
    report = {"tensor_bytes": {"features": 2 ** 20, "adjacency": 2 ** 21}}
    final.write_text(json.dumps({**json.loads(final.read_text()),
                                 "rank_reports": [{"tensor_bytes": {"parameters": 1}}]
                                 + [report] * 4}))
    text = write_report(tmp_path).read_text()
    assert "| Ours (GCN, --secure) | 4 |" in text
    assert "| CAGNET (1.5D, c = 2) | 4 | 0.5000 | 0.3000 | 0.1000 | 2.00 | 2.00 | 3.00 |" in text
    assert "| CAGNET (1D) | 4 |" in text
    assert any(line.startswith("ours-secure,4,")
               for line in (tmp_path / "table3.csv").read_text().splitlines())


def test_a_plan_of_the_old_section_name_fills_table3(tmp_path):
    """A study planned when the time-cost table was called table4 still shows its runs."""
    config = StudyConfig(datasets=("cora",), out=tmp_path, seeds=(0,), figure_seeds=(0,),
                         client_counts=(4,), only=("table3",), epochs=100, figure_epochs=100)
    payload = build_plan(config, lambda d, m: 0.01, lambda d: 100).to_json()
    for entry in payload["runs"]:
        entry["sections"] = ["table4"]
    payload.update(config={"datasets": ["cora"]}, unavailable={}, sessions=[])
    rows = collect_rows(tmp_path, payload)
    assert rows and all(r.sections == "table3" for r in rows)


def test_summarize_metrics_skips_warmup_epoch():
    records = [{"epoch_seconds": 9.0, "compute_seconds": 9.0, "comm_seconds": 0.0,
                "bytes_sent": [0, 2 ** 20], "bytes_received": [0, 0], "peak_rss_mb": [1, 2]},
               {"epoch_seconds": 1.0, "compute_seconds": 0.5, "comm_seconds": 0.5,
                "bytes_sent": [0, 2 ** 21], "bytes_received": [2 ** 20, 0],
                "peak_rss_mb": [1, 3]}]
    out = summarize_metrics(records)
    assert out["epoch_seconds"] == 1.0 and out["client_mb_per_epoch"] == 2.0
    assert out["server_mb_per_epoch"] == 1.0 and out["client_peak_rss_mb"] == 3.0


def test_a_report_is_never_written_into_a_run_or_shard_directory(tmp_path, capsys):
    from study.report import main
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ours", "world_size": 3}))
    (run / "plan.json").write_text(json.dumps({"runs": []}))
    assert main([str(run)]) == 1
    assert capsys.readouterr().err.startswith(
        f"study.report: error: REPORT_DIR {run}: it is a run directory of mpifgl.train")
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "plan.json"]


def test_figure4_is_one_table_per_dataset(tmp_path):
    """Two figure datasets are never averaged into one cell: each gets its table, its figure and
    its rows of fig4.csv."""
    config = StudyConfig(datasets=("cora", "citeseer"), figure_datasets=("cora", "citeseer"),
                         out=tmp_path, seeds=(0,), figure_seeds=(0,), only=("fig4",),
                         figure_epochs=100, methods=("ours", "fedavg"))
    plan = build_plan(config, lambda d, m: 0.01, lambda d: 100)
    payload = plan.to_json()
    payload.update(config={"datasets": ["cora", "citeseer"], "seeds": [0]}, sessions=[])
    (tmp_path / "plan.json").write_text(json.dumps(payload))
    for key in plan.runs:
        _fake_run(tmp_path, key, 0.8 if key.startswith("cora/") else 0.6, np.zeros((4, 2)))
    text = write_report(tmp_path).read_text()
    cora, citeseer = text.split("### cora")[1].split("### citeseer")
    assert "| Ours (GCN) | 80.00 | 80.00 |" in cora and "| Ours (GCN) | 60.00 | 60.00 |" in citeseer
    assert "70.00" not in text
    assert (tmp_path / "fig4.png").is_file() and (tmp_path / "fig4-citeseer.png").is_file()
    rows = (tmp_path / "fig4.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,method,partition") and len(rows) == 1 + 2 * 2 * 2
    assert {r.split(",")[0] for r in rows[1:]} == {"cora", "citeseer"}


def test_figure4_over_several_seeds_gives_mean_and_std_of_every_measure(tmp_path):
    """With --figure-seeds 0,1 a cell is the mean ± std over the seeds: F1, the local bias
    (each seed against its own centralized run) and the disagreement."""
    config = StudyConfig(datasets=("cora",), out=tmp_path, seeds=(0,), figure_seeds=(0, 1),
                         only=("fig4",), figure_epochs=100, methods=("fedavg",))
    plan = build_plan(config, lambda d, m: 0.01, lambda d: 100)
    payload = plan.to_json()
    payload.update(config={"datasets": ["cora"], "seeds": [0]}, sessions=[])
    (tmp_path / "plan.json").write_text(json.dumps(payload))
    ref = np.array([[1.0, 0.0]] * 4)
    for key in plan.runs:
        seed1 = key.endswith("-s1")
        if "/fedavg-" not in key:
            logits, f1 = ref, 0.9
        elif key.startswith("cora/random"):  # distance 1 then 3; no class flips
            logits, f1 = ref + np.array([3.0 if seed1 else 1.0, 0.0]), 0.7 if seed1 else 0.8
        else:  # label skew: half of the nodes flip at seed 1 only
            logits = ref.copy()
            if seed1:
                logits[:2] = [0.0, 1.0]
            f1 = 0.6
        _fake_run(tmp_path, key, f1, logits)
    text = write_report(tmp_path).read_text()
    figure4 = text.split("## Figure 4")[1].split("## Table 3")[0]
    row = next(line for line in figure4.splitlines() if line.startswith("| FedAvg+GCN |"))
    # label skew: seed 0 at distance 0, seed 1 at sqrt(2) on half of the nodes
    assert row == ("| FedAvg+GCN | 75.00 ± 5.00 | 60.00 ± 0.00 | 2.000 ± 1.000 | 0.354 ± 0.354 | "
                   "0.00 ± 0.00% | 25.00 ± 25.00% |")


def test_figure4_has_a_column_of_each_measure_for_every_partition_run(tmp_path):
    """--figure-partitions random,label-skew,louvain: the table has F1, bias and disagreement for
    each, in data_prep's order, and the Louvain runs are measured against the same centralized
    reference as the others."""
    config = StudyConfig(datasets=("cora",), out=tmp_path, seeds=(0,), figure_seeds=(0,),
                         only=("fig4",), figure_epochs=100, methods=("fedavg",),
                         figure_partitions=("louvain", "random", "label-skew"))
    plan = build_plan(config, lambda d, m: 0.01, lambda d: 100)
    payload = plan.to_json()
    payload.update(config={"datasets": ["cora"], "seeds": [0]}, sessions=[])
    (tmp_path / "plan.json").write_text(json.dumps(payload))
    ref = np.array([[1.0, 0.0]] * 4)
    f1 = {"random": 0.8, "label-skew": 0.7, "louvain": 0.6}
    for key in plan.runs:
        if "/fedavg-" not in key:
            _fake_run(tmp_path, key, 0.9, ref)
            continue
        partition = key.split("/")[1].rsplit("-m", 1)[0]
        logits = ref.copy()
        if partition == "louvain":  # one node of four flips
            logits[0] = [0.0, 1.0]
        _fake_run(tmp_path, key, f1[partition], logits)
    text = write_report(tmp_path).read_text()
    figure4 = text.split("## Figure 4")[1].split("## Table 3")[0]
    assert ("| method | iid F1 | non-iid F1 | louvain F1 | iid bias | non-iid bias | louvain bias "
            "| iid disagreement | non-iid disagreement | louvain disagreement |") in figure4
    row = next(line for line in figure4.splitlines() if line.startswith("| FedAvg+GCN |"))
    assert row.startswith("| FedAvg+GCN | 80.00 | 70.00 | 60.00 |")
    assert row.endswith("| 0.00% | 0.00% | 25.00% |")
    rows = (tmp_path / "fig4.csv").read_text().splitlines()
    assert [r.split(",")[2] for r in rows[1:]] == ["random", "label-skew", "louvain"]
