"""Test helpers, imported as ``from tests.helpers.graphs import ...``: tiny graphs written as
shards (graphs), data_prep fixtures, the MPI launcher (mpi), the private SLURM cluster (slurm),
the exactness references (exactness) and the scripts run under mpirun (mpi_scripts/)."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("MPIFGL_DATA_ROOT") or REPO.parent / "shared" / "data")


def require_shared_data(relative: str) -> Path:
    """``SHARED_DATA / relative``; a missing folder fails the (e2e) test instead of skipping it."""
    path = SHARED_DATA / relative
    if not path.is_dir():
        raise FileNotFoundError(f"{path} not found: the e2e tests need the raw datasets of "
                                f"../shared/data (or MPIFGL_DATA_ROOT)")
    return path


def dead_pid() -> int:
    """A pid no process has: pids stay below /proc/sys/kernel/pid_max (no subprocess needed)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())
