"""Node partitions: which client owns each node.

- random: a uniformly random permutation cut into M parts whose sizes differ by at most 1
  (the paper's setting, appendix D).
- label-skew: the paper's non-iid setting (section 4): every client picks a few classes at random
  whose nodes get ``skew_factor`` times the sampling weight of the others; clients keep equal sizes
  by drawing their nodes without replacement, in interleaved rounds so that no client exhausts
  a popular class before the others have had a turn.
- metis: pymetis k-way partition (balanced, few cut edges; not the paper's setting).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from .config import PARTITION_METHODS, PartitionConfig
from .graph import GraphData, seed_stream
from .progress import stage

LABEL_SKEW_ROUNDS = 16  # interleaved draws per client (more = fairer, slower)


@dataclass
class Partition:
    """``assignment[u]`` = client of node u; ``params`` go into the manifest."""

    assignment: np.ndarray  # int32 [n], values 0..M-1
    num_clients: int
    params: dict[str, Any] = field(default_factory=dict)

    def sizes(self) -> np.ndarray:
        return np.bincount(self.assignment, minlength=self.num_clients)


def equal_sizes(num_nodes: int, num_clients: int) -> np.ndarray:
    """M sizes summing to n that differ by at most one (the larger ones first)."""
    base, extra = divmod(num_nodes, num_clients)
    return np.array([base + (i < extra) for i in range(num_clients)], dtype=np.int64)


def random_partition(num_nodes: int, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    assignment = np.empty(num_nodes, dtype=np.int32)
    bounds = np.concatenate([[0], np.cumsum(equal_sizes(num_nodes, num_clients))])
    perm = rng.permutation(num_nodes)
    for client in range(num_clients):
        assignment[perm[bounds[client]:bounds[client + 1]]] = client
    return assignment


def deal_favoured_classes(num_clients: int, num_classes: int, per_client: int,
                          rng: np.random.Generator) -> list[list[int]]:
    """Random favoured classes, dealt like cards from shuffled decks of all classes, so every
    class is favoured by about the same number of clients. With uniform random picks some
    classes would be favoured by several clients and others by none, and equal client sizes
    would then force the clients to absorb the unfavoured classes, flattening the skew."""
    deck: list[int] = []
    dealt = []
    for _ in range(num_clients):
        chosen: list[int] = []
        while len(chosen) < per_client:
            if not deck:
                deck = [int(c) for c in rng.permutation(num_classes)]
            candidate = next((c for c in deck if c not in chosen), None)
            if candidate is None:  # the rest of the deck is already this client's
                deck = [int(c) for c in rng.permutation(num_classes)] + deck
                continue
            deck.remove(candidate)
            chosen.append(candidate)
        dealt.append(sorted(chosen))
    return dealt


def label_skew_partition(y: np.ndarray, num_clients: int, num_classes: int, favoured: int,
                         factor: float, rng: np.random.Generator
                         ) -> tuple[np.ndarray, list[list[int]]]:
    """Equal-size clients; client i samples its nodes without replacement with weight ``factor``
    for its favoured classes and 1 for the others (Efraimidis-Spirakis keys log(U) / w)."""
    n = y.shape[0]
    favoured = min(favoured, num_classes)
    favoured_classes = deal_favoured_classes(num_clients, num_classes, favoured, rng)
    weights = np.ones((num_clients, num_classes), dtype=np.float64)
    for client, chosen in enumerate(favoured_classes):
        weights[client, chosen] = factor
    sizes = equal_sizes(n, num_clients)
    rounds = int(max(1, min(LABEL_SKEW_ROUNDS, sizes.min())))
    assignment = np.full(n, -1, dtype=np.int32)
    pool = np.arange(n, dtype=np.int64)  # nodes not yet assigned
    for r in range(rounds):
        for client in rng.permutation(num_clients):
            take = int(sizes[client] * (r + 1) // rounds - sizes[client] * r // rounds)
            if take == 0:
                continue
            keys = np.log(rng.random(pool.shape[0])) / weights[client, y[pool]]
            chosen = np.argpartition(-keys, take - 1)[:take] if take < pool.shape[0] \
                else np.arange(pool.shape[0])
            assignment[pool[chosen]] = client
            pool = np.delete(pool, chosen)
    assert pool.shape[0] == 0 and assignment.min() >= 0
    return assignment, favoured_classes


def realised_skew(y: np.ndarray, assignment: np.ndarray, favoured: list[list[int]],
                  num_classes: int) -> list[float | None]:
    """Per client: mean share of its favoured classes' nodes / mean share of the other classes'
    (share = fraction of a class's nodes that the client holds); about the factor when the skew
    is fully realised, 1 for an iid split. None when undefined (no other classes)."""
    class_sizes = np.maximum(np.bincount(y, minlength=num_classes), 1)
    ratios: list[float | None] = []
    for client, chosen in enumerate(favoured):
        share = np.bincount(y[assignment == client], minlength=num_classes) / class_sizes
        is_favoured = np.zeros(num_classes, dtype=bool)
        is_favoured[chosen] = True
        others = share[~is_favoured].mean() if (~is_favoured).any() else 0.0
        ratios.append(round(float(share[is_favoured].mean() / others), 3) if others else None)
    return ratios


def metis_partition(adjacency: sp.csr_matrix, num_clients: int, seed: int) -> np.ndarray:
    import pymetis

    n = adjacency.shape[0]
    if num_clients == 1:
        return np.zeros(n, dtype=np.int32)
    options = pymetis.Options(seed=int(seed % (2**31 - 1)))
    graph = pymetis.CSRAdjacency(adjacency.indptr, adjacency.indices)
    result = pymetis.part_graph(num_clients, graph, options=options)
    return np.asarray(result.vertex_part, dtype=np.int32)


def partition_nodes(graph: GraphData, num_clients: int, config: PartitionConfig, seed: int,
                    show_progress: bool = False) -> Partition:
    n = graph.num_nodes
    if num_clients > n:
        raise ValueError(f"--num-clients {num_clients} exceeds the {n} nodes of {graph.name}: "
                         f"every client needs at least one node")
    rng = np.random.default_rng(seed_stream(seed, "partition"))
    with stage(f"partitioning {n:,} nodes into {num_clients} clients ({config.method})",
               show_progress):
        if config.method == "random":
            return Partition(random_partition(n, num_clients, rng), num_clients)
        if config.method == "label-skew":
            config.check_classes(graph.num_classes, graph.name)  # the graph's own count
            assignment, favoured = label_skew_partition(
                graph.y, num_clients, graph.num_classes, config.favoured_classes,
                config.skew_factor, rng)
            return Partition(assignment, num_clients, {
                "favoured_classes": config.favoured_classes, "skew_factor": config.skew_factor,
                "rounds": LABEL_SKEW_ROUNDS, "favoured_classes_per_client": favoured,
                "realised_skew_per_client": realised_skew(graph.y, assignment, favoured,
                                                          graph.num_classes)})
        if config.method == "metis":
            assignment = metis_partition(graph.adjacency, num_clients, seed)
            empty = [i for i, size in enumerate(np.bincount(assignment, minlength=num_clients))
                     if size == 0]
            if empty:
                raise ValueError(f"METIS left clients {empty} without nodes; use fewer clients "
                                 f"or --partition random")
            return Partition(assignment, num_clients, {"tool": "pymetis (METIS k-way)"})
    raise ValueError(f"unknown --partition {config.method!r}; choose one of "
                     f"{', '.join(PARTITION_METHODS)}")
