"""Run under mpirun: for every backbone x dtype, one full-graph forward/backward and one step on a
fixed sample (no dropout); the server writes logits (global order), loss and summed gradients
to NPZ (sampled keys prefixed ``sampled_``, with the sampled rows' global ids).

    mpirun -n M+1 python tests/helpers/mpi_scripts/probe_exactness.py SHARD_DIR OUT.npz LAYERS \
        [EXCHANGE [BUFFER_MB [DEVICE [SECURE [CASES]]]]]

EXCHANGE: one of mpifgl.registry.EXCHANGES (default compact), or several joined by commas, each
run in turn in this one job and written to ``variant_output(OUT, mode)`` (``MODE+secure``: that
mode with --secure); BUFFER_MB:
--exchange-buffer-mb (tiny values force one-row chunks); DEVICE: --device (default cpu); SECURE:
1 for --secure; CASES: backbone_dtype keys joined by commas (default every one of
``tests.helpers.exactness.CASES``). The sample: ``tests.helpers.exactness.fixed_sample``, the
same on every rank.
"""
import sys

import numpy as np

from mpifgl.comm import world
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from fgl_common.shard_format import read_manifest
from mpifgl.hardware import resolve_device
from mpifgl.methods import build_trainer
from tests.helpers.exactness import (CASES, fixed_sample, flat_grads, gather_in_global_order,
                                     operator_logits, variant_output)


def main(shard_dir: str, out: str, layers: int, exchanges: str, buffer_mb: float, device: str,
         secure: bool, cases: str) -> None:
    comm = world()
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    chosen = [(b, d) for b, d in CASES if not cases or f"{b}_{d}" in cases.split(",")]
    modes = exchanges.split(",")
    for variant in modes:
        exchange, _, masked = variant.partition("+")
        probe(comm, manifest, graph, shard_dir, out if len(modes) == 1
              else variant_output(out, variant), layers, exchange, buffer_mb, device,
              secure or masked == "secure", chosen)


def probe(comm, manifest, graph, shard_dir: str, out: str, layers: int, exchange: str,
          buffer_mb: float, device: str, secure: bool, cases) -> None:
    samples = fixed_sample(manifest.client_sizes())
    results = {}
    for backbone, dtype in cases:
        config = TrainConfig(shards=shard_dir, backbone=backbone, dtype=dtype, dropout=0.0,
                             sampling="none", layers=layers, hidden=16, seed=3,
                             exchange=exchange, exchange_buffer_mb=buffer_mb, secure=secure)
        gnn = build_trainer(config, comm, graph, manifest.num_classes,
                            device=resolve_device(device, max(0, comm.client_id))).method
        key = f"{backbone}_{dtype}"
        loss = gnn.loss_and_gradients(gnn.full_operator,
                                      gnn.setup.global_split_counts["train"])
        grads = flat_grads(gnn.model)
        logits, _ = gather_in_global_order(comm, gnn.full_logits().cpu().numpy(),
                                           graph.global_id)
        if comm.is_server:
            results[f"{key}_loss"], results[f"{key}_grads"] = np.asarray(loss), grads
            results[f"{key}_logits"] = logits
        # one step on the fixed sample
        own = samples[comm.client_id] if comm.is_client else None
        operator, train_rows = gnn.operator_for_sample(own)
        loss = gnn.loss_and_gradients(operator, train_rows)
        grads = flat_grads(gnn.model)
        logits, ids = gather_in_global_order(
            comm, operator_logits(comm, gnn, operator, manifest.num_classes),
            graph.global_id[operator.rows.cpu().numpy()])
        if comm.is_server:
            results[f"sampled_{key}_loss"], results[f"sampled_{key}_grads"] = \
                np.asarray(loss), grads
            results[f"sampled_{key}_logits"], results["sampled_ids"] = logits, ids
    if comm.is_server:
        np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         sys.argv[4] if len(sys.argv) > 4 else "compact",
         float(sys.argv[5]) if len(sys.argv) > 5 else 256.0,
         sys.argv[6] if len(sys.argv) > 6 else "cpu",
         len(sys.argv) > 7 and sys.argv[7] == "1",
         sys.argv[8] if len(sys.argv) > 8 else "")
