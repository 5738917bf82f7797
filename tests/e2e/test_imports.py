"""The import invariants in a fresh interpreter, third-party packages included (the unit tier's
tests/unit/test_package_arrows.py scans our own sources only)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.mpi import REPO, mpi_env

CHECKS = [
    ("mpifgl.model, mpifgl.graph, mpifgl.sampling, mpifgl.trainer, mpifgl.secure, "
     "fgl_common.shard_format",
     ("mpi4py",)),
    ("data_prep.__main__, data_prep.api, data_prep.verify", ("mpi4py", "torch_geometric", "torch")),
    ("mpifgl.bias, mpifgl.plot, study.report, study.runner, study.__main__", ("mpi4py", "torch")),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("modules,forbidden", CHECKS, ids=["model", "data_prep", "study"])
def test_importing_loads_no_heavy_or_mpi_package(modules, forbidden):
    code = (f"import sys, {modules}; "
            f"print(' '.join(m for m in {forbidden!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"importing {modules} loaded {done.stdout.split()}"
