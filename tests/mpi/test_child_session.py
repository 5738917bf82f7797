"""fgl_common.child_session: a timed-out or interrupted mpirun leaves no rank running, even a rank
that ignores SIGTERM (mpirun puts each rank in a process group of its own, so killing mpirun's
group alone left them writing into a run directory being reused)."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fgl_common.child_session import (is_live, process_state, run_in_session,
                                      session_members)
from fgl_common.launch import mpi_launch_env, mpirun_path

# each rank writes its pid, ignores SIGTERM (a rank stuck in a C call does not act on it) and
# would write "late" after 60 s: the run directory must never see that file
STUBBORN_RANK = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
(out / f"pid-{rank}").write_text(str(os.getpid()))
time.sleep(60)
(out / f"late-{rank}").write_text("still running")
"""


def _stubborn_job(out: Path) -> list[str]:
    script = out / "rank.py"
    script.write_text(STUBBORN_RANK)
    return [mpirun_path(), "-n", "2", sys.executable, str(script), str(out)]


def _alive(pid: int) -> bool:
    return is_live(process_state(pid))


def _wait_for_pids(out: Path, count: int, seconds: float = 60) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        files = sorted(out.glob("pid-*"))
        if len(files) == count and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not start within {seconds} s")


@pytest.mark.timeout(120)
def test_a_timed_out_job_is_ended_ranks_and_all(tmp_path):
    start = time.monotonic()
    finished = run_in_session(_stubborn_job(tmp_path), timeout=8, env=mpi_launch_env(),
                              stdout=open(tmp_path / "log", "w"), stderr=-2)
    assert finished.timed_out
    pids = [int(f.read_text()) for f in tmp_path.glob("pid-*")]
    assert len(pids) == 2, (tmp_path / "log").read_text()
    assert not any(_alive(pid) for pid in pids), "a rank outlived its timed-out job"
    assert time.monotonic() - start < 50  # ended, not waited out


@pytest.mark.timeout(120)
def test_an_interrupted_caller_ends_the_job_before_the_exception_goes_on(tmp_path):
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    pids: list[int] = []
    try:
        # the alarm fires once both ranks are up (a few seconds), while run_in_session waits
        signal.alarm(6)
        with pytest.raises(KeyboardInterrupt):
            run_in_session(_stubborn_job(tmp_path), timeout=100, env=mpi_launch_env(),
                           stdout=open(tmp_path / "log", "w"), stderr=-2)
        pids = _wait_for_pids(tmp_path, 2, seconds=1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not any(_alive(pid) for pid in pids), "a rank outlived the interrupted caller"


@pytest.mark.timeout(60)
def test_a_finished_launcher_leaves_no_member_of_its_session(tmp_path):
    # the leader starts a child in its own process group (as mpirun does) and exits at once
    orphan = ("import os, subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
              "process_group=0); print(p.pid, flush=True)")
    finished = run_in_session([sys.executable, "-c", orphan], timeout=30,
                              stdout=open(tmp_path / "log", "w"))
    assert finished.returncode == 0 and not finished.timed_out
    child = int((tmp_path / "log").read_text())
    assert not _alive(child)
    assert not session_members(child)


@pytest.mark.timeout(120)
def test_a_launcher_killed_outright_leaves_no_rank_running(tmp_path):
    # the OOM killer or a kill -9 ends mpirun alone: its ranks, in groups of their own, live on
    # unless the session is ended
    def kill_the_launcher(signum, frame):
        rank = int(sorted(tmp_path.glob("pid-*"))[0].read_text())
        launcher = process_state(rank)[1]
        os.kill(launcher, signal.SIGKILL)

    previous = signal.signal(signal.SIGALRM, kill_the_launcher)
    try:
        signal.alarm(6)
        finished = run_in_session(_stubborn_job(tmp_path), timeout=100, env=mpi_launch_env(),
                                  stdout=open(tmp_path / "log", "w"), stderr=-2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert finished.returncode == -signal.SIGKILL and not finished.timed_out
    pids = _wait_for_pids(tmp_path, 2, seconds=1)
    assert not any(_alive(pid) for pid in pids), "a rank outlived its killed launcher"
    assert not list(tmp_path.glob("late-*"))
