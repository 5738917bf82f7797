"""Shards reassemble to exactly the original graph (real and synthetic data, every partition)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.config import PartitionConfig, PrepConfig, SyntheticConfig
from data_prep.datasets import load_dataset
from data_prep.verify import verify_shard_dir
from fgl_common import shard_format

from data_prep_fixtures import (SMALL_SYN, assert_same_graph, copy_raw, edge_set,  # noqa: F401
                                isolated_cache, run_cli)



def load_all(shard_dir: Path) -> tuple[dict, list[shard_format.ClientShard]]:
    manifest = shard_format.read_manifest(shard_dir)
    shards = [shard_format.load_client_shard(shard_dir / c["file"]) for c in manifest.clients]
    return manifest.raw, shards


def check_blocks_transposed(shards: list[shard_format.ClientShard]) -> None:
    for i, shard in enumerate(shards):
        assert set(shard.blocks) == {j for j in range(len(shards))
                                     if j in shard.blocks or i in shards[j].blocks}
        for j, block in shard.blocks.items():
            assert (block != shards[j].blocks[i].T).nnz == 0


def check_local_order(shards: list[shard_format.ClientShard]) -> None:
    for shard in shards:
        assert np.all(np.diff(shard.global_id) > 0)  # ascending global ids


@pytest.mark.parametrize("dataset,relative,num_nodes,num_edges", [
    ("cora", "Planetoid/Cora/raw", 2708, 5278),
    ("amazon-computers", "Amazon/Computers/raw", 13752, 245861),
])
def test_real_dataset_round_trip(tmp_path, isolated_cache, capsys, dataset, relative,
                                 num_nodes, num_edges):
    data_root = copy_raw(tmp_path / "data", relative)
    out = tmp_path / "shards"
    status, stdout, stderr = run_cli(capsys, "--dataset", dataset, "--num-clients", 8,
                                     "--data-root", data_root, "--out", out)
    assert status == 0, stderr
    assert "cross-client edges" in stdout and "peak RSS" in stdout  # the summary
    manifest, shards = load_all(out)
    assert manifest["num_nodes"] == num_nodes and manifest["num_edges"] == num_edges
    assert [c["num_nodes"] for c in manifest["clients"]] == \
        [num_nodes // 8 + (i < num_nodes % 8) for i in range(8)]
    assert abs(manifest["cross_edge_fraction"] - (1 - 1 / 8)) < 0.02
    config = PrepConfig(dataset=dataset, num_clients=8, out=out, data_root=data_root,
                        show_progress=False)
    graph = load_dataset(config)
    nodes, adjacency = shard_format.assemble_global_graph(shards)
    assert_same_graph(nodes, adjacency, graph)
    check_blocks_transposed(shards)
    check_local_order(shards)
    if dataset == "cora":  # official Planetoid "full" split
        assert manifest["split_rule"] == "planetoid-full"
        assert (manifest["num_train"], manifest["num_val"], manifest["num_test"]) == \
            (1208, 500, 1000)
    else:
        assert manifest["split_rule"].startswith("stratified-60/20/20")
    assert not list((tmp_path / "data").rglob("processed"))  # raw copy left untouched
    assert verify_shard_dir(out).ok


def test_cora_matches_pyg_edges(tmp_path, isolated_cache):
    """Independent check of the loader: same edge set as PyG's own edge_index."""
    from torch_geometric.datasets import Planetoid

    data_root = copy_raw(tmp_path / "data", "Planetoid/Cora/raw")
    config = PrepConfig(dataset="cora", num_clients=2, out=tmp_path / "o", data_root=data_root,
                        show_progress=False)
    graph = load_dataset(config)
    pyg_copy = copy_raw(tmp_path / "pyg", "Planetoid/Cora/raw")
    data = Planetoid(str(pyg_copy / "Planetoid"), "Cora", split="full")[0]
    pyg_edges = {(int(a), int(b)) for a, b in data.edge_index.t().tolist() if a != b}
    assert edge_set(graph.adjacency) == pyg_edges
    np.testing.assert_array_equal(graph.x, data.x.numpy())
    np.testing.assert_array_equal(graph.y, data.y.numpy())
    np.testing.assert_array_equal(graph.train_mask, data.train_mask.numpy())


@pytest.mark.parametrize("partition", ["random", "label-skew", "metis"])
@pytest.mark.parametrize("num_clients", [1, 3, 5])
def test_synthetic_round_trip(tmp_path, isolated_cache, capsys, partition, num_clients):
    out = tmp_path / "shards"
    status, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", num_clients,
                                "--partition", partition, "--seed", 3, "--out", out, "--quiet")
    assert status == 0, stderr
    manifest, shards = load_all(out)
    assert manifest["partition"] == partition and manifest["seed"] == 3
    config = PrepConfig(dataset="synthetic", num_clients=num_clients, out=out, seed=3,
                        partition=PartitionConfig(method=partition),
                        synthetic=SyntheticConfig(nodes=600, avg_degree=8, classes=4, features=5),
                        show_progress=False)
    graph = load_dataset(config)
    nodes, adjacency = shard_format.assemble_global_graph(shards)
    assert_same_graph(nodes, adjacency, graph)
    check_blocks_transposed(shards)
    check_local_order(shards)
    for i, (entry, shard) in enumerate(zip(manifest["clients"], shards)):
        assert entry["client_id"] == i and entry["file"] == f"client_{i}.h5"
        assert shard.attrs["client_id"] == i and shard.attrs["partition"] == partition
        assert entry["class_counts"] == np.bincount(shard.y, minlength=4).tolist()
        assert entry["sha256"] == shard_format.file_sha256(out / entry["file"])
    cross = sum(c["num_cross_edges"] for c in manifest["clients"]) // 2
    inner = sum(c["num_inner_edges"] for c in manifest["clients"])
    assert cross + inner == manifest["num_edges"] == 2400
    assert manifest["cross_edge_fraction"] == pytest.approx(cross / 2400)
