"""mpifgl.comm under mpirun: every collective of MPICommunicator gives the known result on
every rank and adds the bytes it must to the counters, at two world sizes."""
from __future__ import annotations

import json

import pytest

from tests.helpers.mpi import MPI_SCRIPTS, run_mpi

COLLECTIVES = str(MPI_SCRIPTS / "collectives.py")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [3, 5])
def test_every_collective_gives_known_results_and_counts_its_bytes(tmp_path, ranks):
    out = tmp_path / "collectives.json"
    done = run_mpi(ranks, [COLLECTIVES, str(out)], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["size"] == ranks
    assert [r["rank"] for r in report["ranks"]] == list(range(ranks))
    assert [f for r in report["ranks"] for f in r["failures"]] == []
