"""Loader paths of the paper's datasets (ogbn-*, reddit), exercised on tiny fake raw files in the
official layouts, since the real files cannot be obtained on these machines."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from data_prep.config import PrepConfig
from data_prep.datasets import load_dataset
from tests.helpers.data_prep_fixtures import (N, edge_set, expected_edges, make_fake_ogb,
                                              tiny_graph)


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


