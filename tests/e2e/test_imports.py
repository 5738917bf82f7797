"""The import invariants in a fresh interpreter, third-party packages included (the unit tier's
tests/unit/test_package_arrows.py scans our own sources only)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# Allocates a 16 MB tensor after importing mpifgl and prints whether its memory carries the
# huge-page advice ("hg" among the VmFlags of the mapping that holds it).
HUGE_PAGE_PROBE = """
import mpifgl  # noqa: F401  (first, as in every entry point)
import torch
tensor = torch.ones(4 << 20)
address = tensor.data_ptr()
flags, inside = [], False
with open("/proc/self/smaps") as smaps:
    for line in smaps:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            flags = line.split()[1:]
print("hg" in flags)
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").exists(),
                    reason="no transparent huge pages in this kernel (or not Linux)")
@pytest.mark.parametrize("setting,advised", [(None, True), ("0", False)], ids=["default", "off"])
def test_large_cpu_tensors_go_on_huge_pages_unless_the_environment_says_no(setting, advised):
    assert probe_with(HUGE_PAGE_PROBE, "THP_MEM_ALLOC_ENABLE", setting) == [str(advised)]


def probe_with(code: str, variable: str, setting: str | None) -> list[str]:
    """The words a fresh interpreter running ``code`` prints, ``variable`` set to ``setting``
    in its environment (None: unset)."""
    env = {name: value for name, value in mpi_env().items() if name != variable}
    if setting is not None:
        env[variable] = setting
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()
