"""Run under mpirun: for every backbone x dtype, one full-graph forward/backward and one step on a
fixed sample (no dropout); the server writes logits (global order), loss and summed gradients
to NPZ (sampled keys prefixed ``sampled_``, with the sampled rows' global ids).

    mpirun -n M+1 python tests/mpi_scripts/probe_exactness.py SHARD_DIR OUT.npz LAYERS \
        [EXCHANGE [BUFFER_MB]]

EXCHANGE: one of mpifgl.exchange.MODES (default compact); BUFFER_MB: --exchange-buffer-mb (tiny
values force one-row chunks). The sample: ``fixed_sample`` below, the same on every rank.
"""
import sys

import numpy as np

from mpifgl.comm import world
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.model import flat_grads, select_rows
from mpifgl.sampling import NodeSample
from fgl_common.shard_format import read_manifest
from mpifgl.methods import build_trainer

SAMPLE_KEEP = 0.6


def fixed_sample(client_sizes) -> list[NodeSample]:
    """Every client's sample: each node kept with probability SAMPLE_KEEP (seeded), p = 0.6."""
    rng = np.random.default_rng(123)
    samples = []
    for n_j in client_sizes:
        index = np.flatnonzero(rng.random(int(n_j)) < SAMPLE_KEEP).astype(np.int64)
        samples.append(NodeSample(index, np.full(index.shape[0], SAMPLE_KEEP)))
    return samples


def gather_in_global_order(comm, logits, global_id, num_rows):
    parts = comm.gatherv_rows(logits)
    ids = comm.gatherv_rows(global_id[:, None].astype(np.int64))
    if not comm.is_server:
        return None, None
    order = np.concatenate([p[:, 0] for p in ids])
    stacked = np.concatenate(parts)
    ordering = np.argsort(order)
    return stacked[ordering], order[ordering]


def main(shard_dir: str, out: str, layers: int, exchange: str, buffer_mb: float) -> None:
    comm = world()
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    samples = fixed_sample(manifest.client_sizes())
    results = {}
    for backbone in ("gcn", "1gnn"):
        for dtype in ("float64", "float32"):
            config = TrainConfig(shards=shard_dir, backbone=backbone, dtype=dtype, dropout=0.0,
                                 sampling="none", layers=layers, hidden=16, seed=3,
                                 exchange=exchange, exchange_buffer_mb=buffer_mb)
            gnn = build_trainer(config, comm, graph, manifest.num_classes).method
            key = f"{backbone}_{dtype}"
            loss = gnn.loss_and_gradients(gnn.full_operator,
                                          gnn.setup.global_split_counts["train"])
            grads = flat_grads(gnn.model)
            logits, _ = gather_in_global_order(comm, gnn.full_logits().numpy(),
                                                                     graph.global_id, manifest.num_nodes)
            if comm.is_server:
                results[f"{key}_loss"], results[f"{key}_grads"] = np.asarray(loss), grads
                results[f"{key}_logits"] = logits
            # one step on the fixed sample
            own = samples[comm.client_id] if comm.is_client else None
            operator, train_rows = gnn.operator_for_sample(own)
            loss = gnn.loss_and_gradients(operator, train_rows)
            grads = flat_grads(gnn.model)
            if comm.is_server:
                gnn.server_exchanges(operator.exchange, backward=False)
                sampled_logits = np.zeros((0, manifest.num_classes))
            else:
                gnn.model.eval()
                sampled_logits = gnn.model(select_rows(gnn.x, operator.rows), operator,
                                           gnn.exchange).detach().numpy()
            logits, ids = gather_in_global_order(comm, sampled_logits.astype(np.float64),
                                                 graph.global_id[operator.rows], 0)
            if comm.is_server:
                results[f"sampled_{key}_loss"], results[f"sampled_{key}_grads"] = \
                    np.asarray(loss), grads
                results[f"sampled_{key}_logits"], results["sampled_ids"] = logits, ids
    if comm.is_server:
        np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         sys.argv[4] if len(sys.argv) > 4 else "compact",
         float(sys.argv[5]) if len(sys.argv) > 5 else 256.0)
