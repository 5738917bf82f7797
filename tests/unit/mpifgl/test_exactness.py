"""The exactness check without MPI: the program's centralized mode equals PyG's GCNConv /
GraphConv on the same weights (tests/mpi/test_exactness.py runs the distributed side), and the
sparse first-layer path computes the dense path's numbers."""
from __future__ import annotations

import numpy as np
import pytest

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from tests.helpers.exactness import (CASES, TOLERANCE, assert_close, centralized_reference,
                                     flat_grads, pyg_reference)
from tests.helpers.graphs import Graph, random_parts, write_shards


def test_centralized_mode_equals_pyg_without_mpi(toy_graph, tmp_path):
    """Plain-pytest tier of the same check (one client, no mpirun)."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 2, seed=2),
                             tmp_path / "shards")
    for backbone, dtype in CASES:
        loss, grads, logits, state = centralized_reference(shard_dir, backbone, dtype, 2)
        reference = pyg_reference(toy_graph, state, backbone, dtype, 2)
        assert_close(logits, reference[2], TOLERANCE[dtype], f"{backbone} {dtype} logits")
        assert_close(loss, reference[0], TOLERANCE[dtype], f"{backbone} {dtype} loss")
        assert_close(grads, reference[1], TOLERANCE[dtype], f"{backbone} {dtype} grads")


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_sparse_and_dense_features_agree(toy_graph, tmp_path, backbone):
    """The sparse first-layer path (bag-of-words inputs) computes the dense path's numbers."""
    graph = Graph(toy_graph.adj, np.where(toy_graph.x > 1.0, toy_graph.x, 0).astype(np.float32),
                  toy_graph.y, toy_graph.train_mask, toy_graph.val_mask, toy_graph.test_mask)
    shard_dir = write_shards(graph, random_parts(graph.num_nodes, 1), tmp_path / "shards")
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(0))])
    results = {}
    for feature_format in ("dense", "sparse"):
        config = TrainConfig(backbone=backbone, dtype="float64", dropout=0.0, sampling="none",
                             hidden=16, seed=3, feature_format=feature_format)
        gnn = build_trainer(config, LocalComm(), merged, manifest.num_classes).method
        loss = gnn.loss_and_gradients(gnn.full_operator,
                                      gnn.setup.global_split_counts["train"])
        results[feature_format] = (loss, flat_grads(gnn.model), gnn.full_logits().numpy())
    for k, what in enumerate(("loss", "grads", "logits")):
        assert_close(results["sparse"][k], results["dense"][k], 1e-12, what)
