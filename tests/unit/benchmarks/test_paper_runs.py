"""The paper-scale benchmarks' runs: a finished run is reused when the same flags ask for it,
whatever path reaches its folder, and set aside, never deleted, when other flags take its place."""
from __future__ import annotations

import json

import pytest

from benchmarks import paper_runs
from benchmarks.paper_runs import run, set_aside, training_flags


def command(shards, out, *flags):
    return ["/opt/mpirun", "-n", "9", "/venv/bin/python", "-m", "mpifgl.train",
            "--shards", str(shards), "--out", str(out), *flags]


def finished_run(out, shards, *flags):
    out.mkdir(parents=True)
    (out / "final.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (out / "driver.json").write_text(json.dumps({"command": command(shards, out, *flags),
                                                 "status": "done"}))
    (out.parent / f"{out.name}.log").write_text("epoch 1\n")


def test_flags_compare_the_folders_not_the_paths_to_them(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (tmp_path / "linked").symlink_to(shards)
    ran = command(shards, tmp_path / "run", "--lr", "0.01")
    assert training_flags(ran) == training_flags(
        ["mpirun", "-m", "mpifgl.train", "--shards", str(tmp_path / "linked"),
         "--out", str(tmp_path / "." / "run"), "--lr", "0.01"])
    assert training_flags(ran) != training_flags(command(shards, tmp_path / "run", "--lr", "0.1"))
    # a value that only looks like a path keeps its text
    assert training_flags(command(shards, tmp_path / "run", "--lr", "./0.01"))[-1] == "./0.01"


def test_a_finished_run_reached_through_a_link_is_reused(tmp_path):
    shards, out = tmp_path / "a" / "shards", tmp_path / "a" / "runs" / "lr0.01-s0"
    shards.mkdir(parents=True)
    finished_run(out, shards, "--lr", "0.01")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "shards").symlink_to(shards)
    (tmp_path / "b" / "run").symlink_to(out)
    record = run(command(tmp_path / "b" / "shards", tmp_path / "b" / "run", "--lr", "0.01"),
                 tmp_path / "b" / "run", timeout=1.0)  # no subprocess: reused
    assert record["status"] == "done"
    assert (out / "metrics.jsonl").read_text() == '{"epoch": 1}\n'


def test_set_aside_keeps_every_earlier_run_and_its_log(tmp_path):
    out = tmp_path / "runs" / "lr0.01-s0"
    finished_run(out, tmp_path, "--lr", "0.01")
    first = set_aside(out)
    assert first.name == "lr0.01-s0.replaced-1" and not out.exists()
    assert (first / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
    assert (first.parent / "lr0.01-s0.replaced-1.log").read_text() == "epoch 1\n"
    finished_run(out, tmp_path, "--lr", "0.1")
    second = set_aside(out)
    assert second.name == "lr0.01-s0.replaced-2" and (first / "final.json").is_file()
    assert json.loads((second / "driver.json").read_text())["command"][-1] == "0.1"


class _Stop(Exception):
    pass


def _no_training(*args, **kwargs):
    raise _Stop  # run() reached the training command: what happened before it is the test


def test_run_sets_aside_a_finished_run_with_other_or_unrecorded_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(paper_runs, "run_in_session", _no_training)
    out = tmp_path / "runs" / "lr0.01-s0"
    finished_run(out, tmp_path, "--lr", "0.01")
    with pytest.raises(_Stop):
        run(command(tmp_path, out, "--lr", "0.1"), out, timeout=1.0)
    assert (tmp_path / "runs" / "lr0.01-s0.replaced-1" / "metrics.jsonl").is_file()
    # a run made by hand has final.json but no driver.json: kept as well
    out.mkdir(exist_ok=True)
    (out / "final.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"epoch": 7}\n')
    with pytest.raises(_Stop):
        run(command(tmp_path, out, "--lr", "0.1"), out, timeout=1.0)
    kept = tmp_path / "runs" / "lr0.01-s0.replaced-2"
    assert (kept / "metrics.jsonl").read_text() == '{"epoch": 7}\n'
