"""Real mpirun runs: every failure after MPI starts ends the whole job with one message, a run
directory belongs to one run, resume works from anywhere, interrupts say how to continue.
Every test has a hard timeout far below a hang; "ended within N s" is the only timing asserted."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.graphs import tamper_shard
from tests.helpers.mpi import MPI_SCRIPTS, REPO, mpi_env, mpirun_path, rank_pids, run_mpi
from tests.helpers.tiny_fs import fill

TRAIN = ["-m", "mpifgl.train"]
PROG = "mpifgl.train"
QUICK = ["--epochs", "3", "--hidden", "16", "--sample-size", "30"]
PROBE = str(MPI_SCRIPTS / "fail_at_phase.py")
ENDS_WITHIN = 60  # seconds: a hang would run into the subprocess timeout instead


def our_lines(done: subprocess.CompletedProcess) -> list[str]:
    """Our lines (Open MPI's abort banner may end without a newline, before one of them)."""
    return [line.strip() for line in (done.stdout + done.stderr).splitlines()
            if line.strip().startswith("mpifgl.train:")]


def ended_with_one_message(done, started: float, expected: str) -> str:
    assert time.monotonic() - started < ENDS_WITHIN
    return one_message(done, expected)


def one_message(done, expected: str) -> str:
    """The job failed with exactly one line of ours, holding ``expected``, and no traceback."""
    assert done.returncode != 0
    lines = our_lines(done)
    assert len(lines) == 1, done.stderr[-3000:]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


# phase, failing rank, what the one line says
PHASES = [
    ("manifest", 2, "client 1 (rank 2): /"),  # agreed set-up finding, reported by rank 0
    ("shard", 1, "client 0 (rank 1): out of memory"),
    ("rundir", 0, "Read-only file system"),
    ("setup", 2, "error on client 1 (rank 2) during set-up: out of memory"),
    ("config", 0, "error on server (rank 0) during set-up: "),
    ("step", 1, "error on client 0 (rank 1) in epoch 1 of 3, step 1 of 2: RuntimeError: injected"),
    ("evaluate", 2, "error on client 1 (rank 2) in epoch 1 of 3, evaluating: Input/output error"),
    ("checkpoint", 0, "checkpoint.pt: No space left on device"),
    ("checkpoint", 1, "error on client 0 (rank 1) while writing the checkpoint of epoch 1: "),
    ("final", 0, "while writing the final outputs: "),
    ("final", 2, "error on client 1 (rank 2) while writing the final outputs: No space left"),
]
# the same failures in a world of 5 ranks (4 clients), on a rank that a world of 3 lacks
PHASES_AT_FIVE = [
    ("setup", 3, "error on client 2 (rank 3) during set-up: out of memory"),
    ("step", 4, "error on client 3 (rank 4) in epoch 1 of 3, step 1 of 2: RuntimeError: injected"),
]
CASES = [(3, *case) for case in PHASES] + [(5, *case) for case in PHASES_AT_FIVE]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks,phase,rank,expected", CASES,
                         ids=[f"n{n}-{p}-rank{r}" for n, p, r, _ in CASES])
def test_failure_on_one_rank_in_any_phase_ends_the_job(toy_shards, tmp_path, ranks, phase, rank,
                                                        expected):
    shards = toy_shards(ranks - 1)
    started = time.monotonic()
    done = run_mpi(ranks, [PROBE, phase, str(rank), "--shards", str(shards), "--out",
                       str(tmp_path / "run"), *QUICK, "--checkpoint-every", "1"], timeout=100)
    line = ended_with_one_message(done, started, expected)
    if phase in ("manifest", "shard", "rundir"):  # agreed: exit 1, no empty run dir left
        assert done.returncode == 1 and not (tmp_path / "run").exists()
    if phase == "config":  # the server reports: the run never started, its directory goes
        assert "config.json: No space left on device" in line
        assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_verbose_adds_the_traceback(toy_shards, tmp_path):
    done = run_mpi(3, [PROBE, "step", "1", "--shards", str(toy_shards(2)), "--out",
                       str(tmp_path / "run"), *QUICK, "--verbose"], timeout=100)
    assert done.returncode != 0 and "Traceback" in done.stderr
    assert "injected failure in a step" in done.stderr


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks,out", [(3, "/proc/x/run"), (3, "afile/run"), (5, "afile/run")])
def test_out_that_cannot_be_created_ends_every_rank(toy_shards, tmp_path, ranks, out):
    (tmp_path / "afile").write_text("a regular file")
    started = time.monotonic()
    done = run_mpi(ranks, [*TRAIN, "--shards", str(toy_shards(ranks - 1)), "--out", out, *QUICK],
                   timeout=100, cwd=tmp_path)
    reason = "No such file or directory" if out.startswith("/proc") else "is a file, not a dir"
    ended_with_one_message(done, started, reason)
    assert done.returncode == 1


@pytest.mark.timeout(240)
def test_two_runs_into_one_out_started_together(toy_shards, tmp_path):
    shards = toy_shards(2)
    run = tmp_path / "run"
    command = [mpirun_path(), "-n", "3", sys.executable, *TRAIN, "--shards", str(shards),
               "--out", str(run), "--epochs", "30", "--hidden", "16"]
    jobs = [subprocess.Popen(command, env=mpi_env(), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [job.communicate(timeout=200) for job in jobs]
    codes = sorted(job.returncode for job in jobs)
    assert codes == [0, 1], results
    loser = next(err for job, (_, err) in zip(jobs, results) if job.returncode == 1)
    assert "in use by another run" in loser or "already holds a run" in loser, loser
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 31))
    assert not (run / ".lock").exists()


@pytest.mark.timeout(300)
def test_resume_from_another_directory_after_a_killed_run(toy_shards, tmp_path):
    shards = toy_shards(2)
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    relative = os.path.relpath(shards, work)
    common = ["--hidden", "16", "--sample-size", "30", "--checkpoint-every", "2", "--seed", "3"]
    done = run_mpi(3, [*TRAIN, "--shards", relative, "--out", "run", "--epochs", "4", *common],
                   timeout=150, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((work / "run" / "config.json").read_text())
    assert saved["shards"] == str(shards.resolve()) and saved["dataset"] == "toy"
    # As if killed while writing its final outputs: a stale lock (dead pid on this host) and the
    # temporary file of an interrupted write, which do not block the resume and are removed.
    (work / "run" / "final.json").unlink()
    (work / "run" / ".final.json.x8k2.tmp").write_text("{")
    (work / "run" / ".lock").write_text(json.dumps({"host": os.uname().nodename, "pid": 2 ** 22 + 7}))
    done = run_mpi(3, [*TRAIN, "--resume", str(work / "run"), "--epochs", "6", "--shards",
                       str(shards)], timeout=150, cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-2000:]
    epochs = [json.loads(line)["epoch"]
              for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (work / "run").iterdir() if p.name.startswith(".")) == []


def _wait_for_metrics(process: subprocess.Popen, run: Path, epochs: int = 2) -> None:
    deadline = time.monotonic() + 90
    while not ((run / "metrics.jsonl").exists()
               and len((run / "metrics.jsonl").read_text().splitlines()) >= epochs):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("who", ["every rank", "one client"])
def test_sigint_ends_training_with_how_to_resume(toy_shards, tmp_path, who):
    """SIGINT delivered to the ranks (as srun does, or a kill of one rank): one line that
    names --resume, exit status 130, the checkpoint kept."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [mpirun_path(), "-n", "3", sys.executable, *TRAIN, "--shards", str(toy_shards(2)),
         "--out", str(run), "--epochs", "100000", "--hidden", "16", "--checkpoint-every", "1"],
        env=mpi_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_metrics(process, run)
        pids = rank_pids(str(run))
        assert sorted(pids) == [0, 1, 2], pids
        for rank in ([0, 1, 2] if who == "every rank" else [2]):
            os.kill(pids[rank], signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip().startswith("mpifgl.train:")]
    assert len(lines) == 1, stderr
    assert "interrupted by SIGINT" in lines[0] and f"--resume {run}" in lines[0]
    assert (run / "checkpoint.pt").is_file()




@pytest.mark.timeout(120)
def test_a_non_finite_loss_on_one_client_ends_every_rank_naming_it(toy_shards, tmp_path):
    """FedAvg keeps each client's numbers apart until the round's sum: features that overflow
    on client 1 make only its local loss NaN. Every rank stops at that step; rank 0 names client
    1 in one line; exit 1; no final.json or model.pt."""
    shards = toy_shards(2)
    tamper_shard(shards, 1, x=lambda x: x * 0 + 3e38)  # finite, but the layer overflows
    run = tmp_path / "run"
    done = run_mpi(3, [*TRAIN, "--algo", "fedavg", "--shards", str(shards), "--out", str(run),
                       "--epochs", "3", "--hidden", "16", "--checkpoint-every", "1"], timeout=100)
    line = one_message(done, "mpifgl.train: error: non-finite local loss "
                                                 "(nan) on client 1 (rank 2) in epoch 1, step 1 "
                                                 "of 1; files kept in ")
    assert done.returncode == 1, line
    assert not (run / "final.json").exists() and not (run / "model.pt").exists()


@pytest.mark.timeout(120)
def test_a_set_up_error_every_rank_meets_is_printed_once(toy_shards, tmp_path):
    done = run_mpi(3, [*TRAIN, "--shards", str(toy_shards(2)), "--out", str(tmp_path / "run"),
                       "--sample-size", "999"], timeout=100)
    one_message(done, "--sample-size is 999, expected at most 60")
    assert done.returncode == 1 and not (tmp_path / "run").exists()


@pytest.mark.needs_mount
@pytest.mark.timeout(150)
def test_a_checkpoint_on_a_full_disk_names_the_file_and_keeps_the_last_one(toy_shards, tiny_fs):
    """A real full file system (tmpfs): the first checkpoint fits, the second does not. One line
    names checkpoint.pt, the free bytes and the bytes needed, and how to resume from the
    first, which is intact."""
    fs = tiny_fs(600 * 1024)
    fill(fs, leave_bytes=420 * 1024)
    run = fs / "run"
    done = run_mpi(3, [*TRAIN, "--shards", str(toy_shards(2)), "--out", str(run), "--epochs",
                       "4", "--hidden", "2000", "--sample-size", "30", "--checkpoint-every", "1"],
                   timeout=120)
    line = one_message(done, "error on server (rank 0) while writing the "
                                                 "checkpoint of epoch 2: ")
    assert f"{run}/checkpoint.pt: No space left on device (the file system has " in line
    assert "bytes free, this write needs " in line
    assert line.endswith(f"; files kept in {run}; continue from its checkpoint of epoch 1 with: "
                         f"mpirun -n 3 python -m mpifgl.train --resume {run}")
    import torch
    assert torch.load(run / "checkpoint.pt", weights_only=False)["epoch"] == 1
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def _start_training(run: Path, shards: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [mpirun_path(), "-n", "3", sys.executable, *TRAIN, "--shards", str(shards), "--out",
         str(run), "--epochs", "100000", "--hidden", "16", "--checkpoint-every", "1", *flags],
        env=mpi_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _end_every_rank(process: subprocess.Popen, pids: dict[int, int]) -> None:
    """Nothing is left behind, whatever the test found: a stopped rank is woken and killed."""
    for pid in pids.values():
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    if process.poll() is None:
        process.kill()
    process.wait()


WATCHDOG_SECONDS = 5


@pytest.mark.timeout(150)
def test_a_frozen_client_ends_the_job_naming_it(toy_shards, tmp_path):
    """kill -STOP of one client in training: the job ends within the watchdog's timeout plus
    30 s with one line naming the stopped rank and its host, how to resume; no rank is left."""
    run = tmp_path / "run"
    process = _start_training(run, toy_shards(2), "--watchdog-seconds", str(WATCHDOG_SECONDS))
    pids = {}
    try:
        _wait_for_metrics(process, run)
        pids = rank_pids(str(run))
        assert sorted(pids) == [0, 1, 2], pids
        os.kill(pids[2], signal.SIGSTOP)
        stopped = time.monotonic()
        _, stderr = process.communicate(timeout=WATCHDOG_SECONDS + 60)
        ended = time.monotonic() - stopped
        left = rank_pids(str(run))
    finally:
        _end_every_rank(process, pids)
    assert process.returncode == 1
    lines = [line.strip() for line in stderr.splitlines() if line.strip().startswith(PROG + ":")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert re.match(rf"{PROG}: error: no collective completed for \d+ s in epoch \d+ of 100000, "
                    rf"(step \d of \d|evaluating|logging)[^:]*: waiting for client 1 \(rank 2\) on "
                    rf"host {re.escape(socket.gethostname())}, which has not answered within "
                    rf"\d+ s \(stopped, swapping, or its node lost\); files kept in {run}; "
                    rf"continue from its checkpoint of epoch \d+ with: mpirun -n 3 python -m "
                    rf"mpifgl.train --resume {run}$", lines[0]), lines[0]
    assert ended < WATCHDOG_SECONDS + 30, ended  # the target: within the timeout plus 30 s
    assert left == {}, left


@pytest.mark.timeout(120)
def test_a_healthy_run_with_a_short_watchdog_completes(toy_shards, tmp_path):
    """--watchdog-seconds 1 while the server takes 3 s to write its checkpoint (the clients wait
    for it in a collective, ask, and the busy server answers): the run completes."""
    run = tmp_path / "run"
    done = run_mpi(3, [str(MPI_SCRIPTS / "slow_checkpoint.py"), "3", "--shards",
                       str(toy_shards(2)), "--out", str(run), *QUICK, "--checkpoint-every", "2",
                       "--watchdog-seconds", "1"], timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "final.json").is_file()


@pytest.mark.timeout(120)
def test_sigterm_twice_to_every_rank_is_one_line(toy_shards, tmp_path):
    """scancel and a time limit signal every rank, and the launcher signals the ranks left after
    the first report's abort: the second signal lands while the ranks wait to report. One line,
    no traceback, exit status 143."""
    run = tmp_path / "run"
    process = _start_training(run, toy_shards(2))
    pids = {}
    try:
        _wait_for_metrics(process, run)
        pids = rank_pids(str(run))
        assert sorted(pids) == [0, 1, 2], pids
        for _ in range(2):
            for pid in pids.values():
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.3)  # the second lands in the ranks' wait before reporting
        _, stderr = process.communicate(timeout=60)
    finally:
        _end_every_rank(process, pids)
    assert process.returncode == 143
    lines = [line.strip() for line in stderr.splitlines() if line.strip().startswith(PROG + ":")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "interrupted by SIGTERM" in lines[0] and f"--resume {run}" in lines[0]


@pytest.mark.timeout(120)
def test_out_of_memory_under_ulimit_is_one_line_with_what_to_change(toy_shards, tmp_path):
    """ulimit -v and a hidden width whose weights do not fit: torch's allocation error becomes one
    line with the size, the limit and what to change; no traceback."""
    command = shlex.join([mpirun_path(), "-n", "3", sys.executable, *TRAIN, "--shards",
                          str(toy_shards(2)), "--out", str(tmp_path / "run"), *QUICK,
                          "--hidden", "200000000"])
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", f"ulimit -v 3000000 && exec {command}"], env=mpi_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=100)
    line = ended_with_one_message(done, started, "during set-up: out of memory allocating 5.2 GiB "
                                                 "(this process may use 2.9 GiB of address "
                                                 "space: ulimit -v); use a smaller --hidden "
                                                 "(now 200000000), --sample-size (now 30) or "
                                                 "--exchange-buffer-mb (now 64.0), or more memory "
                                                 "for each rank")
    assert done.returncode == 1, line
