"""Partition properties (sizes, skew, cross-client edges) and the synthetic generator."""
from __future__ import annotations

import numpy as np
import pytest

from data_prep.config import PartitionConfig, SyntheticConfig
from data_prep.graph import GraphData, stratified_split, seed_stream, undirected_adjacency
from data_prep.partition import (deal_favoured_classes, equal_sizes, label_skew_partition,
                                 partition_nodes, random_partition)
from data_prep.synthetic import generate_synthetic



def synthetic(nodes=4000, classes=8, avg_degree=10.0, homophily=0.8, seed=0) -> GraphData:
    config = SyntheticConfig(nodes=nodes, avg_degree=avg_degree, classes=classes, features=4,
                             homophily=homophily, seed=seed)
    return generate_synthetic(config, split_seed=seed)


def cross_fraction(graph: GraphData, assignment: np.ndarray) -> float:
    coo = graph.adjacency.tocoo()
    return float(np.mean(assignment[coo.row] != assignment[coo.col]))


def test_equal_sizes():
    assert equal_sizes(10, 3).tolist() == [4, 3, 3]
    assert equal_sizes(8, 8).tolist() == [1] * 8


@pytest.mark.parametrize("num_clients", [1, 2, 7, 8])
def test_random_partition_sizes_and_cross_fraction(num_clients):
    graph = synthetic(nodes=5000, avg_degree=20, homophily=0.5)
    part = partition_nodes(graph, num_clients, PartitionConfig("random"), seed=1)
    sizes = part.sizes()
    assert sizes.sum() == 5000 and sizes.max() - sizes.min() <= 1
    assert cross_fraction(graph, part.assignment) == pytest.approx(1 - 1 / num_clients, abs=0.02)


def test_random_partition_is_seeded():
    a = random_partition(1000, 4, np.random.default_rng(5))
    b = random_partition(1000, 4, np.random.default_rng(5))
    c = random_partition(1000, 4, np.random.default_rng(6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def realised_skew(y, assignment, favoured, num_classes) -> list[float]:
    """Per client: mean share of its favoured classes / mean share of the other classes."""
    class_sizes = np.bincount(y, minlength=num_classes)
    ratios = []
    for client, chosen in enumerate(favoured):
        share = np.bincount(y[assignment == client], minlength=num_classes) / class_sizes
        is_favoured = np.zeros(num_classes, dtype=bool)
        is_favoured[chosen] = True
        ratios.append(share[is_favoured].mean() / share[~is_favoured].mean())
    return ratios


@pytest.mark.parametrize("num_clients,classes,favoured", [(4, 8, 2), (8, 4, 1), (7, 14, 2)])
def test_label_skew_is_real_and_sizes_equal(num_clients, classes, favoured):
    y = np.random.default_rng(0).permutation(np.arange(14000) % classes)
    assignment, chosen = label_skew_partition(y, num_clients, classes, favoured, 10.0,
                                              np.random.default_rng(1))
    sizes = np.bincount(assignment, minlength=num_clients)
    assert sizes.max() - sizes.min() <= 1
    assert all(len(c) == favoured for c in chosen)
    ratios = realised_skew(y, assignment, chosen, classes)
    # favoured classes are over-represented by roughly the factor (10)
    assert min(ratios) > 7.0 and max(ratios) < 14.0, ratios
    # and a plain random partition shows no such thing
    plain = random_partition(14000, num_clients, np.random.default_rng(1))
    assert max(realised_skew(y, plain, chosen, classes)) < 1.5


def test_label_skew_factor_one_is_uniform():
    y = np.random.default_rng(0).permutation(np.arange(8000) % 4)
    assignment, chosen = label_skew_partition(y, 4, 4, 1, 1.0, np.random.default_rng(2))
    assert max(realised_skew(y, assignment, chosen, 4)) < 1.3


def test_label_skew_params_in_partition():
    graph = synthetic(nodes=2000, classes=6)
    part = partition_nodes(graph, 3, PartitionConfig("label-skew", favoured_classes=2,
                                                     skew_factor=10.0), seed=0)
    assert part.params["favoured_classes"] == 2 and part.params["skew_factor"] == 10.0
    assert len(part.params["favoured_classes_per_client"]) == 3
    assert all(r > 5 for r in part.params["realised_skew_per_client"])  # 6 classes = 3 x 2


def test_favoured_classes_dealt_evenly():
    dealt = deal_favoured_classes(8, 7, 2, np.random.default_rng(0))
    counts = np.bincount(np.concatenate(dealt), minlength=7)
    assert counts.max() - counts.min() <= 1
    assert all(len(set(c)) == 2 for c in dealt)


def test_metis_cuts_fewer_edges_than_random():
    graph = synthetic(nodes=3000, avg_degree=10, homophily=0.95)
    metis = partition_nodes(graph, 4, PartitionConfig("metis"), seed=0)
    rand = partition_nodes(graph, 4, PartitionConfig("random"), seed=0)
    assert set(np.unique(metis.assignment)) == {0, 1, 2, 3}
    assert cross_fraction(graph, metis.assignment) < cross_fraction(graph, rand.assignment) - 0.2


def test_too_many_clients_rejected():
    graph = synthetic(nodes=50, classes=2, avg_degree=2)
    with pytest.raises(ValueError, match="--num-clients 51 exceeds the 50 nodes"):
        partition_nodes(graph, 51, PartitionConfig("random"), seed=0)


def test_synthetic_graph_properties():
    graph = synthetic(nodes=6000, classes=5, avg_degree=12, homophily=0.7, seed=4)
    adjacency = graph.adjacency
    assert graph.num_edges == 36000  # exact
    assert (adjacency != adjacency.T).nnz == 0  # undirected
    assert adjacency.diagonal().sum() == 0  # no self loops
    assert adjacency.max() == 1  # no duplicates
    coo = adjacency.tocoo()
    homophily = np.mean(graph.y[coo.row] == graph.y[coo.col])
    assert homophily == pytest.approx(0.7, abs=0.02)
    assert np.bincount(graph.y).tolist() == [1200] * 5
    # features carry the class: nearest class mean recovers most labels
    means = np.stack([graph.x[graph.y == c].mean(0) for c in range(5)])
    guess = np.argmin(((graph.x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert np.mean(guess == graph.y) > 0.5
    again = synthetic(nodes=6000, classes=5, avg_degree=12, homophily=0.7, seed=4)
    assert (again.adjacency != adjacency).nnz == 0 and np.array_equal(again.x, graph.x)


def test_synthetic_rejects_impossible_edge_count():
    with pytest.raises(ValueError, match="at most"):
        SyntheticConfig(nodes=10, edges=40, seed=0).validate()


def test_canonical_adjacency_from_messy_edges():
    src = np.array([0, 1, 1, 2, 2, 3, 0])
    dst = np.array([1, 0, 1, 3, 3, 2, 2])  # duplicates, both directions, a self loop
    adjacency = undirected_adjacency(src, dst, 4)
    assert adjacency.nnz == 6 and adjacency.has_canonical_format
    assert adjacency.toarray().tolist() == [[0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 1],
                                            [0, 0, 1, 0]]


def test_stratified_split():
    y = np.repeat(np.arange(3), [100, 50, 10])
    train, val, test = stratified_split(y, seed_stream(0, "split"))
    assert not np.any(train & val) and not np.any(train & test) and not np.any(val & test)
    assert np.all(train | val | test)
    assert [int(train[y == c].sum()) for c in range(3)] == [60, 30, 6]
    assert [int(val[y == c].sum()) for c in range(3)] == [20, 10, 2]


def test_the_loaded_graphs_classes_decide_the_label_skew_knobs():
    """The catalog's class count refuses --favoured-classes at start; the loaded graph's own
    count decides (a graph whose classes the catalog does not know, or gets wrong)."""
    graph = synthetic(nodes=200, classes=3)
    with pytest.raises(ValueError, match=r"--favoured-classes must be in 1\.\.2 for the 3 "
                                         r"classes of synthetic, got 3"):
        partition_nodes(graph, 2, PartitionConfig("label-skew", favoured_classes=3), seed=0)
