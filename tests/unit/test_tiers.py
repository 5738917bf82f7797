"""The tiers hold: an unmarked test cannot start a subprocess (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import UnmarkedSubprocess


def test_an_unmarked_test_cannot_start_a_subprocess():
    with pytest.raises(UnmarkedSubprocess, match="has none of the markers mpi, e2e, slurm, gpu"):
        subprocess.run([sys.executable, "--version"], capture_output=True)
    with pytest.raises(UnmarkedSubprocess):
        subprocess.Popen(["true"])
    with pytest.raises(UnmarkedSubprocess):
        os.system("true")

