"""Plain pytest (no MPI): run directory locks, durable writes, failure messages, resume paths,
the one default shard directory, data_prep's race, litter and --quiet, README commands."""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep import writer
from data_prep.api import prepare_shards
from data_prep.catalog import KNOWN_DATASETS
from fgl_common.ownership import owner_is_dead, remove_dead_owners
from fgl_common.shard_format import default_shard_dir
from mpifgl.config import TrainConfig, parse_config, resumed_config
from mpifgl.failures import SetupError, describe
from mpifgl.runlog import (LOCK_NAME, RunDirError, RunDirectory, atomic_write, claim_run_dir,
                           default_run_dir)

from data_prep_fixtures import SMALL_SYN, SHARED_DATA, isolated_cache, run_cli  # noqa: F401
from mpi_util import REPO, mpi_env

SYN_OPTIONS = dict(syn_nodes=300, syn_avg_degree=6, syn_classes=3, syn_features=4,
                   show_progress=False)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def write_lock(run: Path, **owner) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(),
                                             "started": "earlier", **owner}))


# -- the run directory --------------------------------------------------------------------------
def test_unusable_out_is_refused_with_the_os_reason(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirError, match=r"afile is a file, not a directory"):
        claim_run_dir(tmp_path / "afile" / "run", False, False)
    with pytest.raises(RunDirError, match=r"--out /proc/x: cannot create the run directory"):
        claim_run_dir("/proc/x", False, False)  # os.access says yes here, even for root
    with pytest.raises(RunDirError, match="no checkpoint.pt"):
        claim_run_dir(tmp_path / "new", False, resume=True)


def test_a_run_directory_belongs_to_one_run(tmp_path):
    run = claim_run_dir(tmp_path / "run", False, False)
    with pytest.raises(RunDirError, match=f"in use by another run \\(pid {os.getpid()}"):
        claim_run_dir(tmp_path / "run", False, False)
    with pytest.raises(RunDirError, match="in use by another run"):
        claim_run_dir(tmp_path / "run", True, False)  # --force does not take a live run's dir
    run.write_json("final.json", {})
    run.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    with pytest.raises(RunDirError, match="already holds a run"):
        claim_run_dir(tmp_path / "run", False, False)
    claim_run_dir(tmp_path / "run", True, False).release()


def test_stale_lock_of_a_killed_run_is_taken_over_by_resume_and_force(tmp_path):
    run = tmp_path / "run"
    write_lock(run)
    (run / "checkpoint.pt").write_bytes(b"x")
    claim_run_dir(run, False, resume=True).release()
    write_lock(run)
    claimed = claim_run_dir(run, True, False)
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    claimed.release()


def test_lock_from_another_host_is_never_broken(tmp_path):
    run = tmp_path / "run"
    write_lock(run, host="node-that-is-not-here", pid=1234)
    with pytest.raises(RunDirError, match="on host node-that-is-not-here.*remove .*/run/.lock"):
        claim_run_dir(run, True, False)
    assert not owner_is_dead("node-that-is-not-here", 1234)


def test_pid_reuse_counts_as_dead():
    assert not owner_is_dead(socket.gethostname(), os.getpid())
    assert owner_is_dead(socket.gethostname(), os.getpid(), start_ticks=-1)
    assert owner_is_dead(socket.gethostname(), dead_pid())


def test_default_run_dirs_do_not_collide(tmp_path, monkeypatch):
    names = {default_run_dir("cora", "ours") for _ in range(50)}
    assert len(names) == 50
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert default_run_dir("cora", "ours").name.endswith("-j77_3")
    taken = tmp_path / "runs" / "same"
    taken.mkdir(parents=True)
    with pytest.raises(RunDirError, match="cannot create the run directory"):
        claim_run_dir(taken, False, False, exclusive=True)


# -- durable writes -----------------------------------------------------------------------------
@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_write_never_replaces_a_good_file(tmp_path, monkeypatch, failing):
    run = RunDirectory(tmp_path)
    run.save_torch("checkpoint.pt", {"epoch": 1})

    def broken(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(OSError):
        run.save_torch("checkpoint.pt", {"epoch": 2})
    monkeypatch.undo()
    assert torch.load(tmp_path / "checkpoint.pt") == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_run_files_share_one_mode(tmp_path):
    run = RunDirectory(tmp_path)
    run.append_metrics({"epoch": 1})
    run.write_json("final.json", {})
    run.save_torch("model.pt", {})
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert len(set(modes.values())) == 1, modes


# -- messages, config, resume -------------------------------------------------------------------
def test_describe_names_the_path_and_the_os_reason():
    error = OSError(errno.ENOSPC, "No space left on device", "/runs/a/checkpoint.pt")
    assert describe(error) == "/runs/a/checkpoint.pt: No space left on device"
    assert describe(MemoryError()).startswith("out of memory")
    assert describe(SetupError("world size 4 != 3")) == "world size 4 != 3"
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"


def test_epochs_zero_is_refused():
    with pytest.raises(ValueError, match=r"--epochs is 0, expected an integer >= 1"):
        TrainConfig(epochs=0).validate()


def test_resume_compares_resolved_shard_paths(tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    shards.mkdir()
    saved = TrainConfig(shards=str(shards), epochs=4).to_dict()
    monkeypatch.chdir(tmp_path)
    for spelling in ("shards", "./shards/", str(shards)):
        given = parse_config(["--resume", "r", "--shards", spelling])
        assert resumed_config(saved, given, {"resume", "shards"}).shards == str(shards)
    with pytest.raises(ValueError, match="--shards"):
        resumed_config(saved, parse_config(["--resume", "r", "--shards", "other"]),
                       {"resume", "shards"})


# -- the default shard directory and data_prep ----------------------------------------------------
def test_one_default_shard_directory_name(tmp_path, isolated_cache, monkeypatch):
    assert default_shard_dir("Cora", 8) == Path("shards/cora-random-m8-s0")
    monkeypatch.chdir(tmp_path)
    prepare_shards("synthetic", 3, seed=2, **SYN_OPTIONS)
    assert (tmp_path / default_shard_dir("synthetic", 3, seed=2) / "manifest.json").is_file()
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("SLURM_", "MPIFGL_"))}
    env.update(DRY_RUN="1", DATASET="cora", NUM_CLIENTS="8", DATA_ROOT=str(tmp_path))
    env.pop("SHARD_DIR", None)
    done = subprocess.run(["bash", str(REPO / "jobs" / "data_prep.sbatch")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"--out {REPO / default_shard_dir('cora', 8)}" in done.stdout


def test_loser_of_the_preparation_race_uses_the_winners_shards(tmp_path, monkeypatch):
    out = tmp_path / "shards"
    real_install = writer._install

    def winner_first(scratch, target, force):
        monkeypatch.setattr(writer, "_install", real_install)
        prepare_shards("synthetic", 3, seed=2, out=target, **SYN_OPTIONS)  # the winner
        real_install(scratch, target, force)

    monkeypatch.setattr(writer, "_install", winner_first)
    manifest = prepare_shards("synthetic", 3, seed=2, out=out, **SYN_OPTIONS)
    assert manifest == json.loads((out / "manifest.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]  # the loser's partial is gone


def test_default_run_prepares_through_the_data_prep_program(tmp_path, monkeypatch):
    """Training never imports data_prep: the default run's shards come from `python -m data_prep
    --quiet`; shards a rival job installed meanwhile count as prepared; a failure is one line."""
    from mpifgl import train
    commands = []

    def rival_installed_first(command, **kwargs):
        commands.append(command)
        (tmp_path / "shards").mkdir()
        (tmp_path / "shards" / "manifest.json").write_text("{}")
        return subprocess.CompletedProcess(command, 2, "", "data_prep: error: output exists\n")

    monkeypatch.setattr(train.subprocess, "run", rival_installed_first)
    config = TrainConfig(dataset="cora", data_root="raw")
    train.prepare_default_shards(config, tmp_path / "shards", 3)
    command = commands[0]
    assert command[1:3] == ["-m", "data_prep"] and "--quiet" in command
    assert command[command.index("--num-clients") + 1] == "3"
    assert command[command.index("--data-root") + 1] == "raw"

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 2, "", "a warning\ndata_prep: error: no\n")

    monkeypatch.setattr(train.subprocess, "run", failing)
    with pytest.raises(ValueError, match=r"preparing the default shards in \S+other failed: no$"):
        train.prepare_default_shards(config, tmp_path / "other", 3)


def test_default_run_reports_a_failed_preparation_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mpifgl.train", "--algo", "centralized",
                           "--dataset", "nosuch", "--epochs", "1"], env=mpi_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "mpifgl.train: error: preparing the default shards in shards/nosuch-random-m8-s0 failed: "
        "unknown dataset 'nosuch'; known datasets: " + ", ".join(KNOWN_DATASETS)]
    assert not (tmp_path / "shards").exists()


def test_litter_of_killed_runs_is_removed_by_the_next(tmp_path, capsys):
    dead, live = dead_pid(), os.getpid()
    host = socket.gethostname()
    for owner in (dead, live):
        (tmp_path / f".shards.partial-{host}-{owner}-abc_12").mkdir()
        (tmp_path / "cache" / "raw-copies" / f"cora-{host}-{owner}-xyz").mkdir(parents=True)
    code, _, _ = run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out", tmp_path / "shards",
                         "--quiet")
    assert code == 0
    assert sorted(p.name for p in tmp_path.glob(".shards.*")) == \
        [f".shards.partial-{host}-{live}-abc_12"]
    removed = remove_dead_owners(tmp_path / "cache" / "raw-copies", "cora-")
    assert [p.name for p in removed] == [f"cora-{host}-{dead}-xyz"]


def test_kill_9_during_data_prep_leaves_nothing_the_next_run_keeps(tmp_path):
    command = [sys.executable, "-m", "data_prep", "--dataset", "synthetic", "--syn-nodes",
               "400000", "--syn-avg-degree", "4", "--num-clients", "4", "--out",
               str(tmp_path / "shards"), "--quiet"]
    env = {**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen(command, env=env, cwd=REPO)
    try:
        for _ in range(600):
            if list(tmp_path.glob(".shards.partial-*")) or process.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        assert list(tmp_path.glob(".shards.partial-*")), "killed before writing shards"
        process.kill()
    finally:
        process.wait(timeout=30)
    small = [sys.executable, "-m", "data_prep", *SMALL_SYN, "--num-clients", "2", "--out",
             str(tmp_path / "shards"), "--quiet", "--force"]
    subprocess.run(small, env=env, cwd=REPO, check=True, timeout=120)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_data_prep_quiet_prints_nothing(tmp_path):
    if not (SHARED_DATA / "Planetoid" / "Cora").is_dir():
        pytest.skip("Cora raw files not available")
    done = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "cora",
                           "--num-clients", "2", "--data-root", str(SHARED_DATA), "--out",
                           str(tmp_path / "shards"), "--quiet"],
                          env={**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


# -- README -------------------------------------------------------------------------------------
def test_readme_commands_fit_together():
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    for run, reference in re.findall(r"python -m mpifgl\.bias (\S+) --reference (\S+)", text):
        for run_dir in (run, reference):
            command = next(line for line in text.splitlines() if f"--out {run_dir}" in line)
            assert "--save-logits" in command, command
    prep = re.search(r"DATASET=(\S+) NUM_CLIENTS=(\d+) sbatch jobs/data_prep\.sbatch", text)
    shard_dir = re.search(r"SHARD_DIR=(\S+) sbatch -n \d+ jobs/train\.sbatch", text).group(1)
    assert Path(shard_dir) == default_shard_dir(prep.group(1), int(prep.group(2)))
