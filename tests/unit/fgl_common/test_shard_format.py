"""fgl_common.shard_format on a tiny hand-made graph: a shard round trips exactly, the shards
reassemble the graph, and every damaged field is named (file, field, found, expected)."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from fgl_common.shard_format import (FORMAT_VERSION, ClientShard, ShardError,
                                     assemble_global_graph, check_shard_against_manifest,
                                     default_shard_dir, file_sha256, load_client_shard,
                                     read_manifest, shard_filename, write_client_shard)
from tests.helpers.graphs import Graph, write_shards

# 0 - 1 - 2 - 3 and 0 - 2; node 4 isolated. Clients: {0, 3} and {1, 2, 4}
PARTS = np.array([0, 1, 1, 0, 1])


@pytest.fixture
def graph() -> Graph:
    edges = np.array([(0, 1), (1, 2), (2, 3), (0, 2)])
    adj = sp.coo_matrix((np.ones(8, np.float32), (np.r_[edges[:, 0], edges[:, 1]],
                                                 np.r_[edges[:, 1], edges[:, 0]])),
                        shape=(5, 5)).tocsr()
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    masks = [np.array(m, bool) for m in ([1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 1])]
    return Graph(adj, x, np.array([0, 1, 1, 0, 2]), *masks)


@pytest.fixture
def shard_dir(graph, tmp_path) -> Path:
    return write_shards(graph, PARTS, tmp_path / "shards")


def test_names():
    assert shard_filename(3) == "client_3.h5"
    assert default_shard_dir("Amazon_Computers", 4, "metis", 2) == \
        Path("shards/amazon-computers-metis-m4-s2")


def test_a_shard_round_trips_exactly(tmp_path):
    blocks = {0: sp.csr_matrix(np.array([[0, 1], [1, 0]], np.float32)),
              1: sp.csr_matrix(np.array([[0, 0, 1], [0, 0, 0]], np.float32))}
    shard = ClientShard(0, np.array([4, 7]), np.ones((2, 3), np.float32), np.array([1, 0]),
                        np.array([True, False]), np.array([False, True]),
                        np.array([False, False]), np.array([2, 1]), blocks,
                        {"format_version": FORMAT_VERSION, "dataset": "toy", "client_id": 0})
    write_client_shard(tmp_path / "s.h5", shard)
    back = load_client_shard(tmp_path / "s.h5")
    assert back.client_id == 0 and back.attrs["dataset"] == "toy"
    for name in ("global_id", "x", "y", "train_mask", "val_mask", "test_mask", "degree"):
        np.testing.assert_array_equal(getattr(back, name), getattr(shard, name), err_msg=name)
        assert getattr(back, name).dtype == getattr(shard, name).dtype, name
    assert sorted(back.blocks) == [0, 1]
    for j, block in blocks.items():
        assert back.blocks[j].shape == block.shape
        np.testing.assert_array_equal(back.blocks[j].toarray(), block.toarray())
    without_x = load_client_shard(tmp_path / "s.h5", load_features=False)
    assert without_x.x.shape == (0, 3)


def test_the_shards_reassemble_the_graph(graph, shard_dir):
    manifest = read_manifest(shard_dir)
    assert (manifest.num_clients, manifest.num_nodes, manifest.num_classes) == (2, 5, 3)
    assert manifest.client_sizes() == [2, 3]
    shards = [load_client_shard(shard_dir / shard_filename(i)) for i in range(2)]
    for i, shard in enumerate(shards):
        check_shard_against_manifest(shard, manifest, i, shard_dir / shard_filename(i))
        assert manifest.clients[i]["sha256"] == file_sha256(shard_dir / shard_filename(i))
    assert shards[0].global_id.tolist() == [0, 3] and shards[1].global_id.tolist() == [1, 2, 4]
    nodes, adj = assemble_global_graph(shards)
    np.testing.assert_array_equal(adj.toarray(), graph.adj.toarray())
    np.testing.assert_array_equal(nodes["x"], graph.x)
    np.testing.assert_array_equal(nodes["degree"], [2, 2, 3, 1, 0])


def edit_manifest(shard_dir: Path, change) -> None:
    path = shard_dir / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("change,message", [
    (lambda m: m.update(format_version=99), "format_version 99, this program reads version 1"),
    (lambda m: m.pop("num_classes"), r"missing keys \['num_classes'\]"),
    (lambda m: m.update(num_clients=3), "num_clients is 3 but 'clients' lists 2"),
    (lambda m: m.update(num_nodes=6), "clients' num_nodes add up to 5, manifest num_nodes is 6"),
    (lambda m: m["clients"][1].update(file="client_7.h5"),
     r"clients\[1\] names client_id=1 file='client_7.h5', expected 1 and client_1.h5"),
])
def test_a_bad_manifest_is_named(shard_dir, change, message):
    edit_manifest(shard_dir, change)
    with pytest.raises(ShardError, match=message):
        read_manifest(shard_dir)


def test_missing_directory_manifest_and_shard(tmp_path, shard_dir):
    with pytest.raises(ShardError, match="does not exist"):
        read_manifest(tmp_path / "nowhere")
    with pytest.raises(ShardError, match="manifest missing"):
        read_manifest(tmp_path)
    with pytest.raises(ShardError, match="shard file missing"):
        load_client_shard(shard_dir / "client_9.h5")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(ShardError, match="not a readable HDF5 file"):
        load_client_shard(tmp_path / "junk.h5")


def test_damaged_fields_are_named(shard_dir):
    path = shard_dir / shard_filename(1)
    with h5py.File(path, "a") as f:
        del f["nodes/y"]
        f["nodes/y"] = np.zeros(2, np.int64)
    with pytest.raises(ShardError, match=r"/nodes/y has shape \(2,\), expected \(3,\)"):
        load_client_shard(path)
    with h5py.File(path, "a") as f:
        del f["nodes/y"]
        f["nodes/y"] = np.zeros(3, np.int64)
        f["adj/0/indices"][0] = 5
    with pytest.raises(ShardError, match=r"/adj/0/indices out of range \[0, 2\)"):
        load_client_shard(path)


def test_a_shard_that_disagrees_with_its_manifest_lists_every_problem(shard_dir):
    manifest = read_manifest(shard_dir)
    shard = load_client_shard(shard_dir / shard_filename(1))
    shard.attrs["dataset"] = "other"
    shard.y[0] = 7
    with pytest.raises(ShardError) as error:
        check_shard_against_manifest(shard, manifest, 1, "client_1.h5")
    assert "attribute dataset = 'other', expected 'toy'" in str(error.value)
    assert "labels span [1, 7], manifest says 3 classes" in str(error.value)
    with pytest.raises(ShardError, match="3 nodes, manifest says 2"):
        check_shard_against_manifest(load_client_shard(shard_dir / shard_filename(1)), manifest,
                                     0, "client_1.h5")
