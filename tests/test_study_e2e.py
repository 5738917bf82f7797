"""The study end to end: `python -m study --quick` on Cora, interrupted, then resumed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from study.rundir import run_status

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = REPO.parent / "shared" / "data"


# -- end to end ---------------------------------------------------------------------------------
def _driver(out: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "study", "--datasets", "cora", "--out",
               str(out), "--quick", "--only", "fig6", "--data-root", str(DATA_ROOT), *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.e2e
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
