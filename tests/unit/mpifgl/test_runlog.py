"""mpifgl.runlog: the run directory belongs to one run (locks, stale owners), durable writes,
one file mode, default names, metrics truncated on resume, a full disk named, the leftovers of
killed runs removed, a run that never started leaving no directory."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from fgl_common.diskspace import DiskFullError
from fgl_common.ownership import owner_is_dead
from mpifgl.runlog import (LOCK_NAME, RunDirError, RunDirectory, atomic_write, check_loadable,
                           claim_run_dir, default_run_dir, load_checkpoint)
from tests.helpers import dead_pid
from tests.helpers.tiny_fs import fill


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


# -- the default shard directory and data_prep ----------------------------------------------------


# -- README -------------------------------------------------------------------------------------


def test_atomic_write_keeps_the_previous_file_on_failure(tmp_path):
    run = RunDirectory(tmp_path)
    run.save_torch("checkpoint.pt", {"epoch": 1})

    def crash(tmp):
        with open(tmp, "wb") as handle:
            handle.write(b"half a checkpoint")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "checkpoint.pt", crash)
    assert torch.load(tmp_path / "checkpoint.pt") == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temp left


def test_run_dir_rules(tmp_path):
    claim_run_dir(tmp_path / "new", force=False, resume=False).release()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "final.json").write_text("{}")
    with pytest.raises(RunDirError, match="already holds a run"):
        claim_run_dir(tmp_path / "old", False, False)
    claim_run_dir(tmp_path / "old", True, False).release()
    claim_run_dir(tmp_path / "old", False, resume=True).release()  # the run continues there
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        claim_run_dir(tmp_path / "file", False, False)


def test_metrics_truncated_to_checkpoint_epoch(tmp_path):
    run = RunDirectory(tmp_path)
    for epoch in range(1, 6):
        run.append_metrics({"epoch": epoch, "loss": 1.0 / epoch})
    run.reset_metrics(keep_through_epoch=3)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


# -- a full file system -----------------------------------------------------------------------
@pytest.mark.needs_mount
def test_every_run_file_on_a_full_disk_names_itself_and_keeps_the_previous_one(tiny_fs):
    """Real ENOSPC (a small tmpfs), no faked OSError: each writer's one message names the file,
    the free bytes and the bytes needed; the previous good file stays, no temporary is left."""
    run = RunDirectory(tiny_fs(256 * 1024))
    run.save_torch("checkpoint.pt", {"w": torch.zeros(1000)})
    run.append_metrics({"epoch": 1, "loss": 1.0})
    run.write_json("final.json", {"test_micro_f1": 0.5})
    fill(run.path, leave_bytes=8 * 1024)
    writes = {"checkpoint.pt": lambda: run.save_torch("checkpoint.pt", {"w": torch.zeros(40_000)}),
              "final.json": lambda: run.write_json("final.json", {"x": "y" * 40_000}),
              "logits.npy": lambda: run.save_logits(np.zeros((100, 100))),
              "metrics.jsonl": lambda: run.append_metrics({"epoch": 2, "pad": "z" * 40_000})}
    for name, write in writes.items():
        with pytest.raises(DiskFullError) as caught:
            write()
        assert str(caught.value).startswith(f"{run.path / name}: No space left on device (the "
                                            f"file system has "), caught.value
        assert "bytes free, this write needs " in str(caught.value)
    assert torch.load(run.path / "checkpoint.pt")["w"].shape == (1000,)
    assert json.loads((run.path / "final.json").read_text()) == {"test_micro_f1": 0.5}
    assert [json.loads(line)["epoch"] for line in
            (run.path / "metrics.jsonl").read_text().splitlines()] == [1]  # no torn line
    assert sorted(p.name for p in run.path.iterdir()) == [
        ".ballast", "checkpoint.pt", "final.json", "metrics.jsonl"]


# -- leftovers and runs that never started -------------------------------------------------
def test_the_next_run_removes_a_killed_runs_temporary_files_and_lock(tmp_path):
    run = tmp_path / "run"
    write_lock(run)
    for name in (".checkpoint.pt.k2j3.tmp", ".final.json.x1.tmp", ".model.pt.a.tmp"):
        (run / name).write_bytes(b"half")
    (run / "config.json").write_text("{}")
    claimed = claim_run_dir(run, True, False)
    assert claimed.leftovers == [".checkpoint.pt.k2j3.tmp", ".final.json.x1.tmp",
                                 ".model.pt.a.tmp"]
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME, "config.json"]
    claimed.release()


def test_the_lock_record_of_a_run_starting_now_is_not_a_leftover(tmp_path):
    """A run about to link its owner record to .lock must find the record still there: the
    run that took the lock first removes only the records of dead processes."""
    run = tmp_path / "run"
    run.mkdir()
    live = f"{LOCK_NAME}.{socket.gethostname()}-{os.getpid()}-abc123.tmp"
    dead = f"{LOCK_NAME}.{socket.gethostname()}-{dead_pid()}-def456.tmp"
    older_form = f"{LOCK_NAME}.x7y8z9.tmp"  # from a version whose records named no owner
    for name in (live, dead, older_form):
        (run / name).write_text("{}")
    claimed = claim_run_dir(run, False, False)
    assert claimed.leftovers == sorted([dead, older_form])
    assert sorted(p.name for p in run.iterdir()) == sorted([LOCK_NAME, live])
    claimed.release()


def _claim_together(base: str, rounds: int, barrier, results) -> None:
    """Each round: claim ``base/run<round>`` at the same moment as the other process, hold it
    (or not) until both have tried, then release."""
    outcomes = []
    for round_ in range(rounds):
        barrier.wait()
        claimed = None
        try:
            claimed = claim_run_dir(f"{base}/run{round_}", False, False)
            outcomes.append(("claimed", ""))
        except RunDirError as exc:
            outcomes.append(("refused", str(exc)))
        except BaseException as exc:  # anything else is the bug this test looks for
            outcomes.append(("failed", f"{type(exc).__name__}: {exc}"))
        barrier.wait()
        if claimed is not None:
            claimed.release()
    results.put(outcomes)


@pytest.mark.timeout(120)
def test_two_runs_claiming_one_new_directory_at_once(tmp_path):
    """One takes it, the other is told it is in use, every time; never an OSError of the
    other's temporary files (a winner used to delete the loser's lock record under it)."""
    context = multiprocessing.get_context("fork")
    rounds = 40
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_claim_together,
                               args=(str(tmp_path), rounds, barrier, results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    first, second = (results.get(timeout=100) for _ in workers)
    for worker in workers:
        worker.join(10)
    for outcome in map(sorted, zip(first, second)):
        assert [kind for kind, _ in outcome] == ["claimed", "refused"], outcome
        assert "is in use by another run" in outcome[1][1], outcome


def test_a_run_that_never_started_leaves_no_directory(tmp_path):
    fresh = claim_run_dir(tmp_path / "new", False, False)
    fresh.write_json("config.json", {})
    fresh.abandon()
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine")
    existing = claim_run_dir(tmp_path / "old", False, False)
    existing.abandon()
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_run_directory_follows_the_umask_and_force_keeps_its_mode(tmp_path, umask):
    previous = os.umask(umask)
    try:
        run = claim_run_dir(tmp_path / "runs" / "a", False, False)
        run.release()
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o2775)  # a group's directory, taken again with --force
        (shared / "final.json").write_text("{}")
        claim_run_dir(shared, True, False).release()
    finally:
        os.umask(previous)
    assert oct(os.stat(tmp_path / "runs" / "a").st_mode & 0o7777) == oct(0o777 & ~umask)
    assert oct(os.stat(tmp_path / "runs").st_mode & 0o7777) == oct(0o777 & ~umask)
    assert oct(os.stat(shared).st_mode & 0o7777) == oct(0o2775)


def test_a_run_never_goes_into_a_shard_directory_nor_inside_another_run(tmp_path, toy_shards):
    shards, run = toy_shards(2), tmp_path / "run"
    (run / "inner").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"algo": "ours", "world_size": 3}))
    for out, why in ((shards, "it is a shard directory of data_prep (manifest.json there); a "
                              "run directory must not replace or mix with it"),
                     (shards / "run", f"it lies inside the shard directory {shards} of "
                                      f"data_prep"),
                     (run / "inner", f"it lies inside the run directory {run} of mpifgl.train")):
        with pytest.raises(RunDirError) as refused:
            claim_run_dir(out, True, False)
        assert str(refused.value).startswith(f"--out {out}: {why}")
    assert sorted(p.name for p in shards.iterdir()) == ["client_0.h5", "client_1.h5",
                                                        "manifest.json"]


def test_a_checkpoint_holds_only_what_loads_without_running_code(tmp_path):
    run = RunDirectory(tmp_path)
    with pytest.raises(TypeError, match=r"checkpoint\.pt\['rng'\]\[0\]\['growths'\] is a "
                                        r"numpy\.ndarray: a checkpoint holds only tensors"):
        run.save_torch("checkpoint.pt", {"epoch": 1, "rng": [{"growths": np.zeros(2)}]})
    with pytest.raises(TypeError, match=r"\['x'\] is a numpy\.float64"):
        check_loadable({"x": np.float64(1.0)}, "state")
    state = {"epoch": 3, "w": torch.ones(2), "best": {"val": None}, "slots": {("sum", (2, 1)): 1},
             "big": 2 ** 127, "rng": [{"torch_generator": torch.Generator().get_state()}]}
    run.save_torch("checkpoint.pt", state)  # numpy's generator state is plain ints: it loads
    loaded = load_checkpoint(tmp_path)
    assert loaded["big"] == 2 ** 127 and loaded["slots"] == {("sum", (2, 1)): 1}
    torch.save([1, 2], tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not a checkpoint of mpifgl\.train "
                                         r"\(expected a dict with its epoch, found list\)"):
        load_checkpoint(tmp_path)
