"""Launch real mpirun jobs from tests: Open MPI from the wheel, as root, oversubscribed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fgl_common.launch import mpi_launch_env, mpirun_path

REPO = Path(__file__).resolve().parents[1]


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
