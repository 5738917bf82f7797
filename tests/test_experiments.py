"""The study driver: plan, report from fake run directories, and a --quick run end to end with
an interruption and a resume."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpifgl.experiments import (RunSpec, StudyConfig, build_plan, equal_step_epochs,
                                estimate_seconds, lr_search_plan, parse_config, run_status,
                                train_command)
from mpifgl.report import collect_rows, summarize_metrics, write_report

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = REPO.parent / "shared" / "data"


def _plan(**values):
    defaults = dict(epochs=100, figure_epochs=100, dataset_epochs=(),
                    client_counts=(4, 8, 16, 32))
    defaults["datasets"] = ("cora", "citeseer")
    config = StudyConfig(out=Path("/tmp/x"), **{**defaults, **values})
    return build_plan(config, lambda d, m: 0.01, lambda d: 1000)


def test_plan_deduplicates_and_attaches_references():
    plan = _plan(seeds=(0, 1), figure_seeds=(0,))
    keys = list(plan.runs)
    assert len(keys) == len(set(keys))
    ours8 = plan.runs["cora/random-m8/ours-lr0.01-e100-s0"]
    # one run serves table 2, figure 3, figure 4 and table 4
    assert {"table2", "fig3", "fig4", "table4"} <= set(ours8.sections)
    assert ours8.reference == "cora/random-m8/centralized-lr0.01-e100-s0"
    assert ours8.noise_reference == "cora/random-m8/centralized-lr0.01-e100-s1"
    same_init = plan.runs[ours8.same_init_reference].spec
    assert ours8.same_init_reference == "cora/random-m8/centralized-init0-lr0.01-e100-s1"
    assert same_init.flags == ("--init-seed", "0") and same_init.seed == 1
    assert "cora/random-m32/fedavg-nc-lr0.01-e100-s0" in plan.runs
    assert "cora/label-skew-m8/fedavg-lr0.01-e100-s0" in plan.runs
    assert not any(k.startswith("citeseer/random-m32") for k in keys)  # figures: cora only
    fig5 = [p.spec for p in plan.runs.values() if "fig5" in p.sections]
    assert [s.flags for s in fig5][1] == ("--steps-per-epoch", "2", "--sample-size", "500")


def test_minibatch_baselines_get_about_as_many_steps_as_full_batch_methods():
    # amazon-computers: 8,252 training nodes -> 17 GraphSAGE steps per epoch; 13,752 nodes ->
    # about 9 GraphSAINT subgraphs of at most 512 x 3 nodes per epoch.
    assert equal_step_epochs("graphsage", 200, 13752, 8252) == 12  # 12 x 17 = 204 steps
    assert equal_step_epochs("graphsaint", 200, 13752, 8252) == 23  # 23 x 9 = 207 steps
    assert equal_step_epochs("ours", 200, 13752, 8252) == 200
    assert equal_step_epochs("graphsage", 200, 100, 40) == 200  # one batch per epoch
    assert equal_step_epochs("graphsage", 200, 13752, 8252, min_epochs=40) == 40  # the floor
    assert equal_step_epochs("graphsage", 2, 13752, 8252, min_epochs=40) == 2  # never > epochs
    config = StudyConfig(out=Path("/tmp/x"), datasets=("amazon-computers",), only=("table2",),
                         epochs=200, min_minibatch_epochs=20)
    sizes = (lambda d: 13752), (lambda d: 8252)
    plan = build_plan(config, lambda d, m: 0.01, *sizes)
    epochs = {p.spec.method: p.spec.epochs for p in plan.runs.values()}
    assert epochs["graphsage"] == 20 and epochs["graphsaint"] == 23 and epochs["fedavg"] == 200
    search = {(s.method, s.epochs) for s in lr_search_plan(config, *sizes)}
    assert ("graphsage", 20) in search and ("ours", 200) in search
    unequal = build_plan(StudyConfig(out=Path("/tmp/x"), datasets=("amazon-computers",),
                                     only=("table2",), epochs=200, equal_steps=False),
                         lambda d, m: 0.01, *sizes)
    assert {p.spec.epochs for p in unequal.runs.values()} == {200}


def test_plan_only_and_quick():
    plan = _plan(only=("table2",), seeds=(0,))
    assert len(plan.runs) == 2 * 9 and all(p.sections == ["table2"] for p in plan.runs.values())
    big = _plan(only=("table2",), datasets=("cora", "amazon-computers"), seeds=(0,),
                dataset_epochs=(("amazon-computers", 40),))
    assert {p.spec.epochs for p in big.runs.values() if p.spec.dataset != "cora"} == {40}
    quick = StudyConfig.quick(datasets=("cora",), out=Path("/tmp/x"), only=("fig3",))
    runs = build_plan(quick, lambda d, m: 0.01, lambda d: 100).runs
    assert {p.spec.num_clients for p in runs.values()} == {2, 3}
    assert all(p.spec.epochs == 2 for p in runs.values())


def test_command_and_estimate():
    spec = RunSpec("cora", "ours-star", 4, "random", 1, 5, 0.1)
    command = train_command(spec, Path("S"), Path("R"))
    assert command[1:3] == ["-n", "5"] and command[-1] == "--no-normalize"
    assert "--save-logits" in command and command[command.index("--lr") + 1] == "0.1"
    central = RunSpec("cora", "centralized", 8, "random", 0, 5, 0.01)
    assert train_command(central, Path("S"), Path("R"))[0] == sys.executable
    assert estimate_seconds(spec, 2708) > estimate_seconds(central, 2708)


def test_cli_rejects_unknown_section(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--only", "table9"])
    assert "table9" in capsys.readouterr().err


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


@pytest.mark.timeout(60)
def test_report_from_fake_runs(tmp_path):
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
    assert ours.noise_floor == pytest.approx(math.sqrt(0.5))
    assert ours.client_mb_per_epoch == pytest.approx(2.0)
    assert rows["cora/random-m8/bns-lr0.01-e100-s0"].status == "unavailable"
    assert rows["cora/random-m8/graphsage-lr0.01-e100-s0"].status == "failed"
    path = write_report(tmp_path)
    text = path.read_text()
    assert "| Ours (GCN) | 85.00 ± 5.00 | 89.90 | 95.54 | 79.15 |" in text
    assert "| BNS-GCN | unavailable |" in text and "| GraphSAGE | failed |" in text
    assert "80.00 / 5.000" in text  # figure 3: F1 / bias of ours
    for name in ("runs.csv", "table2.csv", "fig3.csv", "fig3.png", "fig5.csv", "fig5.png"):
        assert (tmp_path / name).is_file(), name
    table2 = (tmp_path / "table2.csv").read_text().splitlines()
    method, mean, std, n = table2[1].split(",")[:4]
    assert (method, int(n)) == ("ours", 2)
    assert (float(mean), float(std)) == pytest.approx((0.85, 0.05))


def test_summarize_metrics_skips_warmup_epoch():
    records = [{"epoch_seconds": 9.0, "compute_seconds": 9.0, "comm_seconds": 0.0,
                "bytes_sent": [0, 2 ** 20], "bytes_received": [0, 0], "peak_rss_mb": [1, 2]},
               {"epoch_seconds": 1.0, "compute_seconds": 0.5, "comm_seconds": 0.5,
                "bytes_sent": [0, 2 ** 21], "bytes_received": [2 ** 20, 0],
                "peak_rss_mb": [1, 3]}]
    out = summarize_metrics(records)
    assert out["epoch_seconds"] == 1.0 and out["client_mb_per_epoch"] == 2.0
    assert out["server_mb_per_epoch"] == 1.0 and out["client_peak_rss_mb"] == 3.0


# -- end to end ---------------------------------------------------------------------------------
def _driver(out: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "mpifgl.experiments", "--datasets", "cora", "--out",
               str(out), "--quick", "--only", "fig6", "--data-root", str(DATA_ROOT), *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(170)
def test_quick_study_interrupted_then_resumed(tmp_path):
    if not (DATA_ROOT / "Planetoid" / "Cora").is_dir():
        pytest.skip("cora raw files not available")
    out = tmp_path / "study"
    first = out / "runs" / "cora/random-m2/ours-lr0.01-e2-s0"
    second = out / "runs" / "cora/random-m2/ours-full-lr0.01-e2-s0"
    driver = _driver(out)
    deadline = time.time() + 120
    while not (first / "driver.json").is_file() and driver.poll() is None:
        assert time.time() < deadline, "first run did not finish"
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)  # interrupt during the second run (or just before it)
    log, _ = driver.communicate(timeout=30)
    assert driver.returncode == 130, log
    assert "interrupted" in log
    assert run_status(first) == "done"
    assert run_status(second) == "pending", "an interrupted run must not be left half-done"
    # a half-done directory (e.g. after kill -9) is removed and redone
    second.mkdir(parents=True)
    (second / "metrics.jsonl").write_text('{"epoch": 1}\n')
    driver = _driver(out)
    log, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, log
    assert "ours-lr0.01-e2-s0: already done, skipped" in log
    assert "removing the half-done run directory" in log
    assert "run 2/2" in log and "ETA" in log
    assert run_status(second) == "done"
    sessions = json.loads((out / "plan.json").read_text())["sessions"]
    assert len(sessions) == 2, "the interrupted session's wall time must be recorded too"
    report = (out / "report.md").read_text()
    assert "over 2 session(s)" in report
    assert "## Figure 6" in report and (out / "fig6.png").is_file()
    assert (second / "logits.npy").is_file()
