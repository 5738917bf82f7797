"""Shards reassemble to exactly the original graph (synthetic data, every partition; the real
datasets in tests/e2e/test_data_prep.py), the one default shard directory name, write_shards
for a graph built in Python (the documented example runs), and a partition read back from its
shards rebuilds them exactly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.config import PartitionConfig, PrepConfig, SyntheticConfig
from fgl_common import shard_format

from data_prep.api import prepare_shards, read_assignment, request_record, write_shards
from data_prep.verify import verify_shard_dir
from fgl_common.shard_format import default_shard_dir
from tests.helpers.data_prep_fixtures import (SMALL_SYN, check_shards_hold_the_dataset, load_all,
                                              run_cli)

SYN_OPTIONS = dict(syn_nodes=300, syn_avg_degree=6, syn_classes=3, syn_features=4,
                   show_progress=False)


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
    check_shards_hold_the_dataset(config, shards)
    for i, (entry, shard) in enumerate(zip(manifest["clients"], shards)):
        assert entry["client_id"] == i and entry["file"] == f"client_{i}.h5"
        assert shard.attrs["client_id"] == i and shard.attrs["partition"] == partition
        assert entry["class_counts"] == np.bincount(shard.y, minlength=4).tolist()
        assert entry["sha256"] == shard_format.file_sha256(out / entry["file"])
    cross = sum(c["num_cross_edges"] for c in manifest["clients"]) // 2
    inner = sum(c["num_inner_edges"] for c in manifest["clients"])
    assert cross + inner == manifest["num_edges"] == 2400
    assert manifest["cross_edge_fraction"] == pytest.approx(cross / 2400)


def test_one_default_shard_directory_name(tmp_path, isolated_cache, monkeypatch):
    assert default_shard_dir("Cora", 8) == Path("shards/cora-random-m8-s0")
    monkeypatch.chdir(tmp_path)
    prepare_shards("synthetic", 3, seed=2, **SYN_OPTIONS)
    assert (tmp_path / default_shard_dir("synthetic", 3, seed=2) / "manifest.json").is_file()


def test_request_records_a_split_order_only_when_not_the_default():
    """Shards written before ``--syn-split-by`` existed keep matching their request."""
    def record(**knobs):
        return request_record(PrepConfig(dataset="synthetic", num_clients=2, out=Path("x"),
                                         synthetic=SyntheticConfig(**knobs)))["synthetic"]
    assert "split_by" not in record()
    assert record(split_by="popularity")["split_by"] == "popularity"


# -- write_shards: a graph built in Python ------------------------------------------------------
def python_example(doc: str) -> str:
    """The code block under "### A graph built in Python" in docs/data_prep.md."""
    section = doc[doc.index("### A graph built in Python"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```\n", start)]


def test_the_documented_python_example_runs(tmp_path, monkeypatch, capsys):
    from tests.helpers.mpi import REPO

    monkeypatch.chdir(tmp_path)
    exec(compile(python_example((REPO / "docs" / "data_prep.md").read_text()), "example", "exec"),
         {})
    for out, partition in (("shards/my-graph-4", "dirichlet"), ("shards/my-graph-owners",
                                                                "given")):
        manifest, _ = load_all(tmp_path / out)
        assert manifest["partition"] == partition and manifest["num_clients"] == 4
        assert verify_shard_dir(tmp_path / out).ok
    np.testing.assert_array_equal(read_assignment(tmp_path / "shards/my-graph-owners"),
                                  np.arange(200) % 4)
    assert capsys.readouterr().out.strip()  # it prints the cross-client share


def test_write_shards_takes_a_pyg_data_a_path_and_refuses_bad_input(tmp_path):
    import torch
    from torch_geometric.data import Data

    rng = np.random.default_rng(1)
    data = Data(x=torch.randn(50, 3), y=torch.arange(50) % 2,
                edge_index=torch.from_numpy(rng.integers(0, 50, (2, 200))))
    manifest = write_shards(data, 2, "louvain", tmp_path / "a", seed=1)
    assert manifest["partition"] == "louvain" and manifest["dataset"] == "graph"
    assert manifest["source"]["graph"] == "write_shards(data)"
    torch.save(data, tmp_path / "mine.pt")
    manifest = write_shards(tmp_path / "mine.pt", 2, out=tmp_path / "b")
    assert manifest["dataset"] == "mine" and manifest["request"]["graph"].endswith("mine.pt")
    for kwargs, message in (
            (dict(partition=np.zeros(49, np.int64)), r"write_shards\(partition\): 49 client ids, "
                                                     r"expected 50"),
            (dict(partition=np.full(50, 2)), r"node 0 has client id 2, expected 0..1"),
            (dict(partition="dirichlet", beta=0.0), "--beta must be > 0, got 0.0"),
            (dict(partition="random", bta=1.0), r"unknown options \['bta'\]"),
            (dict(partition="random", out=None), "out is required")):
        kwargs = {"out": tmp_path / "c", **kwargs}
        with pytest.raises(ValueError, match=message):
            write_shards(data, 2, **kwargs)
        assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match=r"write_shards\(data\): missing key 'y'"):
        write_shards({"x": np.zeros((3, 1)), "edge_index": np.zeros((2, 0), int)}, 1,
                     out=tmp_path / "c")
    with pytest.raises(FileExistsError):
        write_shards(data, 2, out=tmp_path / "a")


# -- --partition file: reproduces a partition ---------------------------------------------------
@pytest.mark.parametrize("partition,suffix", [("random", ".npy"), ("label-skew", ".txt")])
def test_a_partition_read_back_from_its_shards_rebuilds_them(tmp_path, isolated_cache, capsys,
                                                             partition, suffix):
    first, again = tmp_path / "first", tmp_path / "again"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--partition", partition, "--seed",
                   7, "--out", first, "--quiet")[0] == 0
    parts = tmp_path / f"parts{suffix}"
    status, stdout, _ = run_cli(capsys, "assignment", first, parts)
    assert status == 0 and f"600 nodes of {first} to {parts}" in stdout
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--partition", f"file:{parts}",
                   "--seed", 7, "--out", again, "--quiet")[0] == 0
    np.testing.assert_array_equal(read_assignment(first), read_assignment(again))
    (old, old_shards), (new, new_shards) = load_all(first), load_all(again)
    assert new["partition"] == "file" and new["partition_params"] == {"file": str(parts)}
    for key in ("num_nodes", "num_edges", "num_cross_edges", "split_rule"):
        assert old[key] == new[key]
    for a, b in zip(old_shards, new_shards):
        for name in shard_format.NODE_FIELDS:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert a.blocks.keys() == b.blocks.keys()
        assert all((a.blocks[j] != b.blocks[j]).nnz == 0 for j in a.blocks)
    assert run_cli(capsys, "assignment", first, parts)[0] == 2  # never overwrites
