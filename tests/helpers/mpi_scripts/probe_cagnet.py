"""Run under mpirun: CAGNET (``--algo cagnet``) with each replication factor given, float64, no
dropout: one forward/backward (loss, every weight gradient, the logits in global order), then
three optimizer steps (every rank's parameters afterwards, to show they stay bit-identical) and
the bytes each rank counted in one more step. The server writes the NPZ.

    mpirun -n M+1 python tests/helpers/mpi_scripts/probe_cagnet.py SHARD_DIR OUT.npz LAYERS C...
"""
import sys

import numpy as np

from fgl_common.shard_format import read_manifest
from mpifgl.comm import world
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.model import flatten
from tests.helpers.exactness import flat_grads, gather_in_global_order


def main(shard_dir: str, out: str, layers: int, replications: list[int]) -> None:
    comm = world()
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    results = {}
    for c in replications:
        config = TrainConfig(shards=shard_dir, algo="cagnet", replication=c, dtype="float64",
                             dropout=0.0, sampling="none", layers=layers, hidden=16, seed=3)
        method = build_trainer(config, comm, graph, manifest.num_classes).method
        loss = method.loss_and_gradients() if comm.is_client else np.nan
        shares = comm.gather_objects((loss, flat_grads(method.model)))
        logits, _ = gather_in_global_order(comm, method.full_logits().numpy(), graph.global_id)
        for _ in range(3):
            method.train_step()
        parameters = comm.gather_objects(flatten(method.model.parameters()).numpy())
        comm.reset_counters()
        method.train_step()
        traffic = comm.gather_objects((comm.bytes_sent, comm.bytes_received))
        if comm.is_server:
            results[f"c{c}_loss"] = np.asarray([s[0] for s in shares[1:]])
            results[f"c{c}_grads"] = np.stack([s[1] for s in shares[1:]])
            results[f"c{c}_logits"] = logits
            results[f"c{c}_parameters"] = np.stack(parameters)
            results[f"c{c}_traffic"] = np.asarray(traffic[1:], dtype=np.int64)
    if comm.is_server:
        np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(c) for c in sys.argv[4:]])
