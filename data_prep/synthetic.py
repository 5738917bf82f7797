"""Synthetic node-classification graph: stochastic-block-model style edges with a chosen edge
homophily, class-dependent Gaussian features, optionally Zipf-skewed class sizes, log-normal
degree skew and label noise (the knobs that make the task as hard as ogbn-products, docs/scale.md).

Everything is vectorised numpy in fixed-size chunks (no Python loop over nodes or edges), so
graphs of ogbn-products size stay practical on one core (timings: docs/data_prep.md)."""
from __future__ import annotations

import numpy as np

from .config import SyntheticConfig
from .graph import (GraphData, adjacency_from_keys, edge_keys, index_dtype, popularity_split,
                    seed_stream, stratified_split)
from .progress import bar, stage

EDGE_CHUNK = 1 << 22  # edges sampled per vectorised chunk: bounds the temporaries
FEATURE_CHUNK_ROWS = 1 << 17
MAX_SAMPLING_ROUNDS = 60
# Degree skew: node weights are integers round(WEIGHT_RESOLUTION * exp(sigma z)) >= 1, so a
# weighted draw is a uniform draw from an "urn" holding each node as often as its weight (O(1) per
# edge, no binary search). 4 keeps the rounding small; the urn holds 4 exp(sigma^2 / 2) entries
# per node on average, which is why --syn-degree-skew stops at 2.
WEIGHT_RESOLUTION = 4


def class_sizes(nodes: int, classes: int, skew: float) -> np.ndarray:
    """Class sizes proportional to (k+1)^-skew (Zipf), every class at least one node, summing
    to ``nodes`` (largest remainders get the leftover nodes)."""
    share = np.arange(1, classes + 1, dtype=np.float64) ** -skew
    spare = nodes - classes  # after one node per class
    exact = spare * share / share.sum()
    sizes = np.floor(exact).astype(np.int64)
    leftover = spare - int(sizes.sum())
    sizes[np.argsort(sizes - exact, kind="stable")[:leftover]] += 1
    return sizes + 1


def _sorted_unique(keys: np.ndarray, nearly_sorted: bool) -> np.ndarray:
    # timsort ("stable") is linear-ish on a sorted block followed by a short unsorted tail.
    keys = np.sort(keys, kind="stable" if nearly_sorted else None)
    if keys.size:
        keep = np.empty(keys.shape[0], dtype=bool)
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
    return keys


class _EdgeSampler:
    """Draws node pairs: u in proportion to its weight; v in u's class with probability h, else
    outside it, again in proportion to the weights (no weights: every node weighs 1)."""

    def __init__(self, y: np.ndarray, homophily: float, rng: np.random.Generator,
                 weights: np.ndarray | None = None):
        self.n = y.shape[0]
        self.y = y
        self.homophily = homophily
        self.rng = rng
        members = np.argsort(y, kind="stable")  # node ids grouped by class
        if weights is None:
            self.urn = members
            self.class_sizes = np.bincount(y).astype(np.int64)
        else:  # each node repeated weight times, still grouped by class
            self.urn = np.repeat(members.astype(index_dtype(self.n, 0)), weights[members])
            self.class_sizes = np.bincount(y, weights=weights).astype(np.int64)
        self.weighted = weights is not None
        self.class_start = np.concatenate([[0], np.cumsum(self.class_sizes)[:-1]]).astype(np.int64)

    def sample_keys(self, count: int) -> np.ndarray:
        rng, urn_size = self.rng, self.urn.shape[0]
        if self.weighted:
            u = self.urn[rng.integers(0, urn_size, count, dtype=np.int64)].astype(np.int64)
        else:
            u = rng.integers(0, self.n, count, dtype=np.int64)
        cls = self.y[u]
        start, size = self.class_start[cls], self.class_sizes[cls]
        r = rng.random(count)
        same = rng.random(count) < self.homophily
        inside = start + (r * size).astype(np.int64)
        outside = (r * (urn_size - size)).astype(np.int64)  # position among the other classes
        outside += (outside >= start) * size  # skip over u's own class block
        v = self.urn[np.where(same, inside, outside)]
        return edge_keys(u, v, self.n)


def _node_labels(config: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    n, classes = config.nodes, config.classes
    if config.class_skew == 0:  # the balanced draw of earlier versions: same graphs, same seeds
        return rng.permutation(np.arange(n, dtype=np.int64) % classes)
    sizes = class_sizes(n, classes, config.class_skew)
    return rng.permutation(np.repeat(np.arange(classes, dtype=np.int64), sizes))


def _node_weights(config: SyntheticConfig, rng: np.random.Generator) -> np.ndarray | None:
    if config.degree_skew == 0:
        return None
    z = rng.standard_normal(config.nodes)
    weights = np.rint(WEIGHT_RESOLUTION * np.exp(config.degree_skew * z))
    return np.maximum(weights, 1).astype(np.int64)


def generate_synthetic(config: SyntheticConfig, split_seed: int,
                       show_progress: bool = False) -> GraphData:
    """Generate the graph described by ``config`` (``config.seed`` must be set)."""
    assert config.seed is not None
    config.validate()
    rng = np.random.default_rng(seed_stream(config.seed, "synthetic"))
    n, classes, dim = config.nodes, config.classes, config.features
    target = config.num_edges
    y = _node_labels(config, rng)

    sampler = _EdgeSampler(y, config.homophily, rng, _node_weights(config, rng))
    keys = np.zeros(0, dtype=np.int64)
    with bar(f"synthetic: sampling {target:,} edges", target, show_progress) as count:
        for round_index in range(MAX_SAMPLING_ROUNDS):
            missing = target - keys.shape[0]
            # Oversample a little: self loops and repeated pairs are dropped afterwards.
            draw = int(missing * 1.02) + 64
            parts = [keys]
            for start in range(0, draw, EDGE_CHUNK):
                parts.append(sampler.sample_keys(min(EDGE_CHUNK, draw - start)))
                count.update(min(parts[-1].shape[0], target - count.n))  # drawn so far
            keys = _sorted_unique(np.concatenate(parts), nearly_sorted=round_index > 0)
            del parts
            count.n = min(target, keys.shape[0])  # distinct edges kept
            count.refresh()
            if keys.shape[0] >= target:  # checked after the round: the last one may finish
                break
        else:
            raise ValueError(f"synthetic graph: could not place {target} distinct edges among "
                             f"{n} nodes with homophily {config.homophily} and {classes} classes "
                             f"(only {keys.shape[0]} after {MAX_SAMPLING_ROUNDS} rounds); lower "
                             f"--syn-avg-degree/--syn-edges, --syn-homophily or "
                             f"--syn-degree-skew")
    del sampler
    if keys.shape[0] > target:  # drop the surplus uniformly, keeping the keys sorted
        surplus = rng.choice(keys.shape[0], keys.shape[0] - target, replace=False)
        keys = np.delete(keys, surplus)

    with stage("synthetic: building the adjacency", show_progress):
        adjacency = adjacency_from_keys(keys, n)
        del keys

    with bar(f"synthetic: {n:,} x {dim} features", n, show_progress) as count:
        class_means = (rng.standard_normal((classes, dim), dtype=np.float32)
                       * np.float32(config.feature_signal))
        x = np.empty((n, dim), dtype=np.float32)
        for start in range(0, n, FEATURE_CHUNK_ROWS):
            stop = min(n, start + FEATURE_CHUNK_ROWS)
            x[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
            x[start:stop] += class_means[y[start:stop]]
            count.update(stop - start)

    if config.label_noise > 0:  # after edges and features: they keep following the true class
        noisy = np.flatnonzero(rng.random(n) < config.label_noise)
        y[noisy] = y[rng.integers(0, n, noisy.shape[0])]

    fractions = config.fractions
    if config.split_by == "popularity":
        rule, split = "popularity", popularity_split(np.diff(adjacency.indptr),
                                                     seed_stream(split_seed, "split"), fractions)
    else:
        rule, split = "stratified", stratified_split(y, seed_stream(split_seed, "split"), fractions)
    train, val, test = split
    percent = "/".join(f"{100 * f:g}" for f in fractions)
    graph = GraphData(name="synthetic", adjacency=adjacency, x=x, y=y, train_mask=train,
                      val_mask=val, test_mask=test, num_classes=classes,
                      split_rule=f"{rule}-{percent} seed={split_seed}",
                      source={"generator": "stochastic block model, Gaussian class features, Zipf "
                                           "class sizes, log-normal degree weights, label noise",
                              **config.as_dict()})
    graph.check()
    return graph
