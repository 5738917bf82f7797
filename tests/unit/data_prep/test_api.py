"""Shards reassemble to exactly the original graph (synthetic data, every partition; the real
datasets in tests/e2e/test_data_prep.py), and the one default shard directory name."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.config import PartitionConfig, PrepConfig, SyntheticConfig
from fgl_common import shard_format

from data_prep.api import prepare_shards, request_record
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
