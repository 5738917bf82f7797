"""Launch real mpirun jobs from tests: Open MPI from the wheel, as root, oversubscribed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def mpirun_path() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else (shutil.which("mpirun") or "mpirun")


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
