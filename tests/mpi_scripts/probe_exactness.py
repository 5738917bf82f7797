"""Run under mpirun: one full-graph forward/backward (no dropout, no sampling) for every
backbone x dtype; the server writes logits (global order), loss and summed gradients to NPZ.

    mpirun -n M+1 python tests/mpi_scripts/probe_exactness.py SHARD_DIR OUT.npz LAYERS [EXCHANGE]

EXCHANGE: reduce (default) or star, the server's way of summing the cross-client terms.
"""
import sys

import numpy as np

from mpifgl.comm import world
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.model import flat_grads
from mpifgl.shards import read_manifest
from mpifgl.trainer import Trainer


def main(shard_dir: str, out: str, layers: int, exchange: str) -> None:
    comm = world()
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    results = {}
    for backbone in ("gcn", "1gnn"):
        for dtype in ("float64", "float32"):
            config = TrainConfig(shards=shard_dir, backbone=backbone, dtype=dtype, dropout=0.0,
                                 sampling="none", layers=layers, hidden=16, seed=3,
                                 exchange=exchange)
            trainer = Trainer(config, comm, graph, manifest.num_classes, None)
            loss = trainer.loss_and_gradients(trainer.full_operator,
                                              trainer.global_split_counts["train"])
            grads = flat_grads(trainer.model)
            logits = trainer.full_logits().numpy()
            parts = comm.gatherv_rows(logits)
            ids = comm.gatherv_rows(graph.global_id[:, None].astype(np.int64))
            if comm.is_server:
                ordered = np.empty((manifest.num_nodes, logits.shape[1]), dtype=logits.dtype)
                ordered[np.concatenate([p[:, 0] for p in ids])] = np.concatenate(parts)
                key = f"{backbone}_{dtype}"
                results[f"{key}_loss"] = np.asarray(loss)
                results[f"{key}_grads"] = grads
                results[f"{key}_logits"] = ordered
    if comm.is_server:
        np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         sys.argv[4] if len(sys.argv) > 4 else "reduce")
