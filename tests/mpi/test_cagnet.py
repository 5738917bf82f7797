"""CAGNET under mpirun (mpifgl/methods/cagnet.py): with 2 and 4 clients and replication 1 and 2,
its loss, every weight gradient and the logits equal the program's centralized full batch in
float64 to 1e-10, every rank's parameters stay bit-identical over steps, and each rank's bytes
per step are the schedule's (``step_traffic``) exactly (tests/unit/mpifgl/methods/test_cagnet.py
has the same in threads, and the trained runs)."""
from __future__ import annotations

import numpy as np
import pytest

from fgl_common.shard_format import read_manifest
from mpifgl.methods.cagnet import step_traffic
from tests.helpers.exactness import assert_close, centralized_reference
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import MPI_SCRIPTS, run_mpi
from tests.helpers.runs import run_ok

PROBE = str(MPI_SCRIPTS / "probe_cagnet.py")
LAYERS = 3


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_clients", [2, 4])
def test_cagnet_equals_centralized_under_mpirun(toy_graph, tmp_path, num_clients):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=5),
                             tmp_path / "shards")
    out = tmp_path / "probe.npz"
    run_ok(run_mpi(num_clients + 1, [PROBE, str(shard_dir), str(out), str(LAYERS), "1", "2"],
                   timeout=200))
    results = np.load(out)
    loss, grads, logits, _ = centralized_reference(shard_dir, "gcn", "float64", LAYERS)
    sizes = np.asarray(read_manifest(shard_dir).client_sizes())
    widths = [toy_graph.x.shape[1]] + [16] * (LAYERS - 1) + [toy_graph.num_classes]
    for c in (1, 2):
        for client in range(num_clients):
            assert_close(results[f"c{c}_loss"][client], loss, 1e-10, f"c={c} loss")
            assert_close(results[f"c{c}_grads"][client], grads, 1e-10, f"c={c} gradients")
        assert_close(results[f"c{c}_logits"], logits, 1e-10, f"c={c} logits")
        parameters = results[f"c{c}_parameters"]  # the server's row 0 included
        assert all(np.array_equal(row, parameters[0]) for row in parameters), f"c={c}"
        assert results[f"c{c}_traffic"].tolist() == \
            [list(t) for t in step_traffic(sizes, c, widths, 8)], f"c={c} bytes"
