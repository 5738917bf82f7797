"""The synthetic generator's difficulty knobs (class skew, degree skew, label noise, homophily)
do what their flags say, and the graph is a pure function of its config and seed. No training."""
from __future__ import annotations

import numpy as np
import pytest

from data_prep.config import SyntheticConfig
from data_prep.graph import GraphData
from data_prep.synthetic import class_sizes, generate_synthetic

HARD = dict(homophily=0.8, feature_signal=0.05, class_skew=1.0, degree_skew=1.0, label_noise=0.25)


def generate(seed: int = 0, nodes: int = 6000, classes: int = 10, avg_degree: float = 20.0,
             **knobs) -> GraphData:
    config = SyntheticConfig(nodes=nodes, avg_degree=avg_degree, classes=classes, features=6,
                             seed=seed, **knobs)
    return generate_synthetic(config, split_seed=seed)


def edge_homophily(graph: GraphData) -> float:
    coo = graph.adjacency.tocoo()
    return float(np.mean(graph.y[coo.row] == graph.y[coo.col]))


def test_deterministic_in_the_seed():
    first, again = generate(seed=5, **HARD), generate(seed=5, **HARD)
    other = generate(seed=6, **HARD)
    assert (first.adjacency != again.adjacency).nnz == 0
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert (first.adjacency != other.adjacency).nnz > 0
    assert not np.array_equal(first.y, other.y)


def test_class_sizes_follow_zipf():
    assert class_sizes(10, 3, 0.0).tolist() == [4, 3, 3]
    # shares 6:3:2 of the 11 nodes left after one per class
    assert class_sizes(14, 3, 1.0).tolist() == [7, 4, 3]
    assert class_sizes(5, 5, 2.0).tolist() == [1] * 5  # every class keeps a node
    graph = generate(classes=10, class_skew=1.0)
    counts = np.bincount(graph.y, minlength=10)
    assert counts.tolist() == class_sizes(6000, 10, 1.0).tolist()
    assert counts[0] / counts[-1] == pytest.approx(10.0, rel=0.05)  # (k+1)^-1: first / tenth
    assert np.all(np.diff(counts) <= 0)


@pytest.mark.parametrize("knobs", [{}, {"class_skew": 1.0},
                                   {"class_skew": 1.0, "degree_skew": 1.0}])
def test_measured_homophily_is_the_requested_one(knobs):
    graph = generate(homophily=0.6, **knobs)
    assert graph.num_edges == 60000  # exact, also with hubs
    assert edge_homophily(graph) == pytest.approx(0.6, abs=0.02)


def test_degree_skew_gives_a_heavy_tail():
    flat, skewed = generate(), generate(degree_skew=1.0)
    degree_flat = np.diff(flat.adjacency.indptr)
    degree_skewed = np.diff(skewed.adjacency.indptr)
    assert degree_flat.mean() == degree_skewed.mean() == 20.0
    # Poisson(20): coefficient of variation about 0.22; log-normal weights, sigma 1: about 1.3
    assert degree_flat.std() / degree_flat.mean() < 0.3
    assert degree_skewed.std() / degree_skewed.mean() > 1.0
    assert degree_skewed.max() > 10 * np.median(degree_skewed)
    assert np.median(degree_skewed) < degree_skewed.mean()


def test_label_noise_changes_labels_only():
    clean, noisy = generate(class_skew=1.0), generate(class_skew=1.0, label_noise=0.3)
    assert (clean.adjacency != noisy.adjacency).nnz == 0 and np.array_equal(clean.x, noisy.x)
    share = class_sizes(6000, 10, 1.0) / 6000
    # a noisy node takes the label of a random node, which is its own with chance sum(share^2)
    expected_changed = 0.3 * (1 - np.sum(share ** 2))
    assert np.mean(clean.y != noisy.y) == pytest.approx(expected_changed, abs=0.02)
    # edges keep following the true class, so the labels' homophily drops
    assert edge_homophily(noisy) < edge_homophily(clean) - 0.2


@pytest.mark.parametrize("field, value, message", [
    ("class_skew", -1.0, "--syn-class-skew must be >= 0, got -1.0"),
    ("degree_skew", 2.5, r"--syn-degree-skew must be in \[0, 2\], got 2.5"),
    ("label_noise", 1.5, r"--syn-label-noise must be in \[0, 1\], got 1.5"),
    ("split_by", "sales", "--syn-split-by must be one of class, popularity, got 'sales'"),
])
def test_knobs_validated(field, value, message):
    with pytest.raises(ValueError, match=message):
        SyntheticConfig(seed=0, **{field: value}).validate()


def test_split_fractions_inside_every_class():
    graph = generate(classes=4, split=(0.08, 0.02))
    assert graph.split_rule == "stratified-8/2/90 seed=0"
    for k in range(4):
        members = graph.y == k
        size = int(members.sum())
        assert graph.train_mask[members].sum() == np.floor(size * 0.08 + 0.5)
        assert graph.val_mask[members].sum() == np.floor(size * 0.10 + 0.5) - np.floor(
            size * 0.08 + 0.5)
    masks = np.stack([graph.train_mask, graph.val_mask, graph.test_mask])
    assert np.all(masks.sum(axis=0) == 1)  # every node in exactly one split


def test_split_leaves_the_graph_alone():
    default, products = generate(**HARD), generate(split=(0.0803, 0.0161), **HARD)
    assert default.split_rule == "stratified-60/20/20 seed=0"
    assert (default.adjacency != products.adjacency).nnz == 0
    assert np.array_equal(default.x, products.x) and np.array_equal(default.y, products.y)


def test_popularity_split_trains_on_the_best_connected():
    by_class = generate(split=(0.08, 0.02), **HARD)
    graph = generate(split=(0.08, 0.02), split_by="popularity", **HARD)
    assert graph.split_rule == "popularity-8/2/90 seed=0"
    assert (graph.adjacency != by_class.adjacency).nnz == 0 and np.array_equal(graph.y, by_class.y)
    degree = np.diff(graph.adjacency.indptr)
    assert (graph.train_mask.sum(), graph.val_mask.sum(), graph.test_mask.sum()) == (480, 120, 5400)
    assert np.all(np.stack([graph.train_mask, graph.val_mask, graph.test_mask]).sum(axis=0) == 1)
    # ranked by degree: every train node at least as connected as every val node, and so on
    assert degree[graph.train_mask].min() >= degree[graph.val_mask].max()
    assert degree[graph.val_mask].min() >= degree[graph.test_mask].max()
    assert degree[graph.train_mask].mean() > 3 * degree[graph.test_mask].mean()  # the shift
    # equal degrees at the boundary are ordered by the split seed, reproducibly
    config = SyntheticConfig(nodes=6000, avg_degree=20.0, classes=10, features=6, seed=0,
                             split=(0.08, 0.02), split_by="popularity", **HARD)
    again, other = (generate_synthetic(config, split_seed=seed) for seed in (0, 1))
    assert np.array_equal(graph.train_mask, again.train_mask)
    assert not np.array_equal(graph.test_mask, other.test_mask)
    assert np.array_equal(np.sort(degree[graph.train_mask]), np.sort(degree[other.train_mask]))


@pytest.mark.parametrize("split", [(0.7, 0.4), (-0.1, 0.2), (0.5,), (0.5, 0.2, 0.3)])
def test_split_validated(split):
    with pytest.raises(ValueError, match="--syn-split must be two fractions TRAIN,VAL"):
        SyntheticConfig(seed=0, split=split).validate()
