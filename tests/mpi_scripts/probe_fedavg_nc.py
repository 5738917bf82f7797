"""Run under mpirun: build the fedavg-nc method on every rank; the server writes, per client, the
collected cross-client neighbours (client-ordered ids), the local graph's added features and its
local adjacency to NPZ.

    mpirun -n M+1 python tests/mpi_scripts/probe_fedavg_nc.py SHARD_DIR OUT.npz FRACTION
"""
import sys

import numpy as np

from mpifgl.comm import world
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from fgl_common.shard_format import read_manifest
from mpifgl.methods import build_trainer


def main(shard_dir: str, out: str, fraction: float) -> None:
    comm = world()
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    config = TrainConfig(shards=shard_dir, algo="fedavg-nc", nc_fraction=fraction, hidden=8,
                         seed=4)
    fedavg = build_trainer(config, comm, graph, manifest.num_classes).method
    local = fedavg.local
    mine = {"collected": fedavg.collected, "added_x": local.x[local.num_own:],
            "adjacency": local.graph.inner.toarray(), "degree": local.graph.degree,
            "candidates": np.unique(graph.cross.indices)}
    everything = comm.gather_objects(mine)
    if comm.is_server:
        np.savez(out, **{f"{key}_{rank - 1}": value for rank, part in enumerate(everything)
                         if rank > 0 for key, value in part.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
