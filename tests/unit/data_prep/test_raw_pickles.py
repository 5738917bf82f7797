"""Pickled raw files (Planetoid) are read only when they build the objects the real ones do:
the check reads their opcodes, so a crafted file is refused before anything of it runs."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from data_prep.raw_pickles import PLANETOID_OBJECTS, check_pickled_file, pickled_objects
from tests.helpers import require_shared_data
from tests.helpers.data_prep_fixtures import copy_raw, run_cli


class RunsCode:
    """Unpickling it would create ``marker`` (what a hostile raw file would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_the_real_planetoid_files_pass_and_the_objects_they_build_are_named():
    raw = require_shared_data("Planetoid/Cora/raw")
    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        path = raw / f"ind.cora.{part}"
        check_pickled_file(path, PLANETOID_OBJECTS, path)
    assert set(pickled_objects((raw / "ind.cora.graph").read_bytes())) == {
        ("collections", "defaultdict"), ("__builtin__", "list")}
    for protocol in (2, 4, 5):  # numpy and scipy of today, every protocol: names resolved
        data = pickle.dumps([np.arange(3), sp.csr_matrix(np.eye(2))], protocol=protocol)
        assert None not in pickled_objects(data)


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_crafted_raw_file_is_refused_before_the_loader_runs_it(tmp_path, isolated_cache,
                                                                 capsys, protocol):
    root = copy_raw(tmp_path / "data", "Planetoid/Cora/raw")
    marker = tmp_path / "MARKER"
    target = root / "Planetoid/Cora/raw/ind.cora.x"
    target.write_bytes(pickle.dumps(RunsCode(marker), protocol=protocol))
    status, _, stderr = run_cli(capsys, "--dataset", "cora", "--num-clients", 2, "--data-root",
                                root, "--out", tmp_path / "shards", "--quiet")
    assert status == 2 and stderr.splitlines() == [
        f"data_prep: error: {target}: refused: unpickling it would call io.open, which could "
        f"run code; the original file builds numpy arrays, scipy matrices and lists only: "
        f"replace it with the dataset's own file"]
    assert not marker.exists() and not (tmp_path / "shards").exists()
    pickle.loads(target.read_bytes())  # what the loader would have done: it runs
    assert marker.exists()
