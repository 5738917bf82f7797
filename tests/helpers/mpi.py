"""Launch real mpirun jobs from tests: Open MPI from the wheel, as root, oversubscribed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fgl_common.launch import mpi_launch_env, mpirun_path
from tests.helpers import REPO

MPI_SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"


def mpi_env() -> dict[str, str]:
    """The project's MPI launch environment (fgl_common.launch), this checkout on PYTHONPATH."""
    env = mpi_launch_env()
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_mpi(ranks: int, args: list[str], timeout: float = 120, cwd: str | Path | None = None,
            **kwargs) -> subprocess.CompletedProcess:
    """``mpirun -n ranks python ARGS`` with a hard timeout (a hang fails the test, never blocks)."""
    command = [mpirun_path(), "-n", str(ranks), sys.executable, *args]
    return subprocess.run(command, env=mpi_env(), cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def run_python(args: list[str], timeout: float = 120, cwd: str | Path | None = None
               ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=mpi_env(), cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


def rank_pids(marker: str) -> dict[int, int]:
    """MPI rank -> pid of the python processes whose command line contains ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in cmdline and "mpifgl.train" in cmdline and "mpirun" not in cmdline:
            for item in environ:
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    found[int(item.split(b"=")[1])] = int(entry.name)
    return found
