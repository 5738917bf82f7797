"""Synthetic node-classification graph: stochastic-block-model style edges with a chosen edge
homophily, class-dependent Gaussian features, balanced classes.

Everything is vectorised numpy in fixed-size chunks (no Python loop over nodes or edges), so an
ogbn-products-sized graph (2.4 M nodes, 62 M edges) is generated in about a minute on one core."""
from __future__ import annotations

import numpy as np

from .config import SyntheticConfig
from .graph import (GraphData, adjacency_from_keys, edge_keys, seed_stream, stratified_split)
from .progress import Progress

EDGE_CHUNK = 1 << 22  # edges sampled per vectorised chunk (~200 MB of temporaries)
FEATURE_CHUNK_ROWS = 1 << 17
MAX_SAMPLING_ROUNDS = 60


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
    """Draws node pairs: u uniform; v in u's class with probability h, else uniform outside it."""

    def __init__(self, y: np.ndarray, homophily: float, rng: np.random.Generator):
        self.n = y.shape[0]
        self.y = y
        self.homophily = homophily
        self.rng = rng
        self.members = np.argsort(y, kind="stable")  # node ids grouped by class
        self.class_sizes = np.bincount(y).astype(np.int64)
        self.class_start = np.concatenate([[0], np.cumsum(self.class_sizes)[:-1]]).astype(np.int64)

    def sample_keys(self, count: int) -> np.ndarray:
        rng, n = self.rng, self.n
        u = rng.integers(0, n, count, dtype=np.int64)
        cls = self.y[u]
        start, size = self.class_start[cls], self.class_sizes[cls]
        r = rng.random(count)
        same = rng.random(count) < self.homophily
        inside = start + (r * size).astype(np.int64)
        outside = (r * (n - size)).astype(np.int64)  # position among the other classes' nodes
        outside += (outside >= start) * size  # skip over u's own class block
        v = self.members[np.where(same, inside, outside)]
        return edge_keys(u, v, n)


def generate_synthetic(config: SyntheticConfig, split_seed: int, progress: Progress) -> GraphData:
    """Generate the graph described by ``config`` (``config.seed`` must be set)."""
    assert config.seed is not None
    config.validate()
    rng = np.random.default_rng(seed_stream(config.seed, "synthetic"))
    n, classes, dim = config.nodes, config.classes, config.features
    target = config.num_edges
    y = rng.permutation(np.arange(n, dtype=np.int64) % classes)

    sampler = _EdgeSampler(y, config.homophily, rng)
    keys = np.zeros(0, dtype=np.int64)
    with progress.counter(f"synthetic: sampling {target:,} edges", target) as count:
        for round_index in range(MAX_SAMPLING_ROUNDS):
            missing = target - keys.shape[0]
            if missing <= 0:
                break
            # Oversample a little: self loops and repeated pairs are dropped afterwards.
            draw = int(missing * 1.02) + 64
            parts = [keys]
            for start in range(0, draw, EDGE_CHUNK):
                parts.append(sampler.sample_keys(min(EDGE_CHUNK, draw - start)))
                count.update(min(parts[-1].shape[0], target - count.done))  # drawn so far
            keys = _sorted_unique(np.concatenate(parts), nearly_sorted=round_index > 0)
            del parts
            count.done = min(target, keys.shape[0])  # distinct edges kept
        else:
            raise ValueError(f"synthetic graph: could not place {target} distinct edges among "
                             f"{n} nodes with homophily {config.homophily} and {classes} classes "
                             f"(only {keys.shape[0]} after {MAX_SAMPLING_ROUNDS} rounds); lower "
                             f"--syn-avg-degree/--syn-edges or --syn-homophily")
    if keys.shape[0] > target:  # drop the surplus uniformly, keeping the keys sorted
        surplus = rng.choice(keys.shape[0], keys.shape[0] - target, replace=False)
        keys = np.delete(keys, surplus)

    with progress.step("synthetic: building the adjacency"):
        adjacency = adjacency_from_keys(keys, n)
        del keys

    with progress.counter(f"synthetic: {n:,} x {dim} features", n) as count:
        class_means = (rng.standard_normal((classes, dim), dtype=np.float32)
                       * np.float32(config.feature_signal))
        x = np.empty((n, dim), dtype=np.float32)
        for start in range(0, n, FEATURE_CHUNK_ROWS):
            stop = min(n, start + FEATURE_CHUNK_ROWS)
            x[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
            x[start:stop] += class_means[y[start:stop]]
            count.update(stop - start)

    train, val, test = stratified_split(y, seed_stream(split_seed, "split"))
    graph = GraphData(name="synthetic", adjacency=adjacency, x=x, y=y, train_mask=train,
                      val_mask=val, test_mask=test, num_classes=classes,
                      split_rule=f"stratified-60/20/20 seed={split_seed}",
                      source={"generator": "stochastic block model, Gaussian class features",
                              **config.as_dict()})
    graph.check()
    return graph
