"""Loader paths of the paper's datasets (ogbn-*, reddit), exercised on tiny fake raw files in the
official layouts, since the real files cannot be obtained on these machines."""
from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from data_prep.config import PrepConfig
from data_prep.catalog import KNOWN_DATASETS
from data_prep.datasets import load_dataset

from data_prep_fixtures import REPO, isolated_cache  # noqa: F401

N = 40


def tiny_graph(seed: int = 0):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N, 120)
    dst = rng.integers(0, N, 120)
    return rng, src, dst


def write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for row in rows:
            handle.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def make_fake_ogb(data_root: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    spec = KNOWN_DATASETS[name]
    rng, src, dst = tiny_graph()
    folder = data_root / "OGB" / name.replace("-", "_")
    raw = folder / "raw"
    write_csv_gz(raw / "edge.csv.gz", zip(src, dst))
    write_csv_gz(raw / "node-feat.csv.gz", rng.normal(size=(N, 3)).round(3))
    labels = rng.integers(0, 4, N)
    write_csv_gz(raw / "node-label.csv.gz", labels)
    write_csv_gz(raw / "num-node-list.csv.gz", [N])
    write_csv_gz(raw / "num-edge-list.csv.gz", [len(src)])
    if name == "ogbn-arxiv":
        write_csv_gz(raw / "node_year.csv.gz", rng.integers(2000, 2020, N))
    split_dir = [p for p in spec.raw_files if "/split/" in p][0].split("/split/")[1].split("/")[0]
    perm = rng.permutation(N)
    for part, ids in zip(("train", "valid", "test"), (perm[:20], perm[20:30], perm[30:])):
        write_csv_gz(folder / "split" / split_dir / f"{part}.csv.gz", sorted(ids))
    (folder / "RELEASE_v1.txt").write_text("fake release\n")
    return labels, perm


def expected_edges(src, dst):
    keep = src != dst
    pairs = {(int(a), int(b)) for a, b in zip(src[keep], dst[keep])}
    return pairs | {(b, a) for a, b in pairs}


def edge_set(adjacency):
    coo = adjacency.tocoo()
    return set(zip(coo.row.tolist(), coo.col.tolist()))


def test_fake_ogbn_products_and_arxiv(tmp_path, isolated_cache):
    for name in ("ogbn-products", "ogbn-arxiv"):
        root = tmp_path / name
        labels, perm = make_fake_ogb(root, name)
        config = PrepConfig(dataset=name, num_clients=2, out=tmp_path / "o", data_root=root,
                            show_progress=False)
        graph = load_dataset(config)
        _, src, dst = tiny_graph()
        assert edge_set(graph.adjacency) == expected_edges(src, dst)
        np.testing.assert_array_equal(graph.y, labels)
        assert graph.split_rule == "ogb-official"
        assert sorted(np.flatnonzero(graph.train_mask)) == sorted(perm[:20])
        assert sorted(np.flatnonzero(graph.test_mask)) == sorted(perm[30:])
        assert not list(root.rglob("processed"))  # loaded from a copy


def test_fake_reddit(tmp_path, isolated_cache):
    rng, src, dst = tiny_graph(1)
    raw = tmp_path / "Reddit" / "raw"
    raw.mkdir(parents=True)
    node_types = rng.integers(1, 4, N)
    labels = rng.integers(0, 5, N)
    np.savez(raw / "reddit_data.npz", feature=rng.normal(size=(N, 6)).astype(np.float32),
             label=labels, node_types=node_types)
    sp.save_npz(raw / "reddit_graph.npz",
                sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(N, N)))
    config = PrepConfig(dataset="reddit", num_clients=2, out=tmp_path / "o", data_root=tmp_path,
                        show_progress=False)
    graph = load_dataset(config)
    assert edge_set(graph.adjacency) == expected_edges(src, dst)
    np.testing.assert_array_equal(graph.y, labels)
    np.testing.assert_array_equal(graph.train_mask, node_types == 1)
    np.testing.assert_array_equal(graph.val_mask, node_types == 2)
    assert graph.split_rule == "reddit-official"


def test_no_mpi_and_no_pyg_at_import():
    code = ("import sys, data_prep.__main__, data_prep.api, data_prep.verify; "
            "bad = [m for m in ('mpi4py', 'torch_geometric', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
