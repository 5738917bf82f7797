"""Node partitions: which client owns each node.

- random: a uniformly random permutation cut into M parts whose sizes differ by at most 1
  (the paper's setting, appendix D).
- label-skew: the paper's non-iid setting (section 4): every client picks a few classes at random
  whose nodes get ``skew_factor`` times the sampling weight of the others; clients keep equal sizes
  by drawing their nodes without replacement, in interleaved rounds so that no client exhausts
  a popular class before the others have had a turn.
- metis: pymetis k-way partition (balanced, few cut edges; not the paper's setting).
- dirichlet: FedGCN's label Dirichlet split (``label_dirichlet_partition`` of its utils.py): per
  class, a Dirichlet(beta) share of its nodes for every client, redrawn until every client holds
  ``min_client_nodes``; the same numpy calls in the same order, so ``--seed S`` gives the
  clients FedGCN gives after ``np.random.seed(S)``.
- louvain: FedSage+'s ``louvain_graph_cut`` (src/utils/louvain_networkx.py) on communities from
  igraph's compiled multilevel (Louvain) method instead of python-louvain.
- file:PATH: the client of every node as given (``read_assignment_file``).
"""
from __future__ import annotations

import random as python_random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from .config import FILE_PARTITION, PARTITION_METHODS, PartitionConfig
from .graph import GraphData, seed_stream
from .progress import stage

LABEL_SKEW_ROUNDS = 16  # interleaved draws per client (more = fairer, slower)
# FedGCN redraws forever; a client that cannot reach the minimum ends with an error instead
DIRICHLET_MAX_DRAWS = 1000
# FedSage+ gives every client at least this many nodes of every class, taken from the others
LOUVAIN_MIN_PER_CLASS = 2
# edges turned into Python pairs at once while igraph reads the edge list (bounds that memory)
IGRAPH_EDGE_CHUNK = 1 << 20


@dataclass
class Partition:
    """``assignment[u]`` = client of node u; ``params`` go into the manifest."""

    assignment: np.ndarray  # int32 [n], values 0..M-1
    num_clients: int
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # how long it took (the summary's, not the manifest's: not identity)

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


def dirichlet_partition(y: np.ndarray, num_clients: int, num_classes: int, beta: float,
                        min_client_nodes: int, seed: int) -> tuple[np.ndarray, int]:
    """FedGCN's label Dirichlet split -> (assignment, draws it took).

    Per draw and class k: the class's nodes shuffled, shares p ~ Dirichlet(beta, ..., beta) over
    the clients, zeroed for every client already holding n / M nodes, renormalised, and the
    shuffled nodes cut at floor(cumsum(p) * |k|). The draw is repeated until the smallest client
    holds ``min_client_nodes``. The legacy ``RandomState(seed)`` makes the same calls in the
    same order as FedGCN on numpy's global state; its last per-client shuffle only orders each
    client's list and is left out."""
    n = y.shape[0]
    rng = np.random.RandomState(seed)
    by_class = [np.flatnonzero(y == k) for k in range(num_classes)]
    smallest = 0
    for draw in range(1, DIRICHLET_MAX_DRAWS + 1):
        sizes = np.zeros(num_clients, dtype=np.int64)
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for nodes in by_class:
            nodes = nodes.copy()
            rng.shuffle(nodes)
            shares = rng.dirichlet(np.repeat(beta, num_clients))
            shares = shares * (sizes < n / num_clients)
            with np.errstate(invalid="ignore"):  # an empty class when every client is full
                shares = shares / shares.sum()
                cuts = (np.cumsum(shares) * nodes.shape[0]).astype(int)[:-1]
            for client, part in enumerate(np.split(nodes, cuts)):
                pieces[client].append(part)
                sizes[client] += part.shape[0]
        smallest = int(sizes.min())
        if smallest >= min_client_nodes:
            assignment = np.empty(n, dtype=np.int32)
            for client, parts in enumerate(pieces):
                assignment[np.concatenate(parts)] = client
            return assignment, draw
    raise ValueError(f"--partition dirichlet --beta {beta}: after {DIRICHLET_MAX_DRAWS} draws a "
                     f"client still held only {smallest} nodes, expected at least "
                     f"--min-client-nodes {min_client_nodes}; raise --beta, lower "
                     f"--min-client-nodes or use fewer clients")


def louvain_communities(adjacency: sp.csr_matrix, seed: int) -> np.ndarray:
    """Community of every node: igraph's multilevel (Louvain) method, modularity at resolution
    1, the final level (python-louvain's ``best_partition``, which FedSage+ calls), its node
    order drawn from a generator seeded with ``seed``."""
    import igraph

    graph = igraph.Graph(n=adjacency.shape[0], edges=_upper_edges(adjacency), directed=False)
    igraph.set_random_number_generator(python_random.Random(seed))
    try:
        membership = graph.community_multilevel().membership
    finally:
        igraph.set_random_number_generator(python_random)
    return np.asarray(membership, dtype=np.int64)


def _upper_edges(adjacency: sp.csr_matrix) -> Iterator[tuple[int, int]]:
    """Every undirected edge once, (u, v) with u < v, row by row: a generator igraph consumes in
    one call. A numpy edge array would first be turned into Python objects for every edge,
    several times the graph's own memory, and adding pieces one call at a time rebuilds
    igraph's index at every call."""
    indptr = adjacency.indptr
    cuts = np.searchsorted(indptr, np.arange(0, adjacency.nnz, 2 * IGRAPH_EDGE_CHUNK),
                           side="right") - 1
    bounds = np.unique(np.concatenate([[0], cuts, [adjacency.shape[0]]]))
    for low, high in zip(bounds[:-1], bounds[1:]):
        sources = np.repeat(np.arange(low, high, dtype=np.int64), np.diff(indptr[low:high + 1]))
        targets = adjacency.indices[indptr[low]:indptr[high]].astype(np.int64)
        upper = targets > sources
        yield from zip(sources[upper].tolist(), targets[upper].tolist())


def fedsage_assignment(communities: np.ndarray, y: np.ndarray, num_clients: int,
                       num_classes: int, delta: int) -> tuple[np.ndarray, dict[str, int]]:
    """FedSage+'s ``louvain_graph_cut`` from the communities on: communities in the order of
    their first node, each cut into pieces of at most n/M - delta nodes (the rest appended as a
    new community), the pieces dealt largest first to the current client while it stays below
    n/M + delta, a client leaving the deal at n/M; then every client short of 2 nodes of a
    class takes one from each client holding more than 2 (FedSage+'s loop has no break).

    Departures where FedSage+ stops or hangs: a piece that fits no remaining client (FedSage+
    loops forever) and the pieces left once every client reached n/M (it divides by zero) go
    to the smallest client; the pieces are at least one node when n/M <= delta; class 0 is
    counted like every other (FedSage+ blanks the labels of other clients' nodes with 0, so it
    never counts an integer class 0)."""
    n = communities.shape[0]
    _, first, inverse = np.unique(communities, return_index=True, return_inverse=True)
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    by_group = np.argsort(rank[inverse], kind="stable")  # nodes ascending inside a community
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rank[inverse]))])
    pieces = [by_group[bounds[g]:bounds[g + 1]] for g in range(first.shape[0])]
    longest = max(1, n // num_clients - delta)
    g = 0
    while g < len(pieces):  # FedSage+ iterates over its growing list of groups
        if pieces[g].shape[0] > longest:
            pieces.append(pieces[g][longest:])
            pieces[g] = pieces[g][:longest]
        g += 1
    order = sorted(range(len(pieces)), key=lambda k: -pieces[k].shape[0])  # stable
    share = n // num_clients
    held = np.zeros(num_clients, dtype=np.int64)
    assignment = np.empty(n, dtype=np.int32)
    open_clients = list(range(num_clients))
    current = 0
    fallbacks = 0
    for k in order:
        size = pieces[k].shape[0]
        while open_clients and held[open_clients[current]] >= share:
            open_clients.pop(current)
            current = current % len(open_clients) if open_clients else 0
        target = None
        for _ in range(len(open_clients)):
            if held[open_clients[current]] + size < share + delta:
                target = open_clients[current]
                break
            current = (current + 1) % len(open_clients)
        if target is None:
            target = int(np.argmin(held))
            fallbacks += 1
        assignment[pieces[k]] = target
        held[target] += size
    moved = _give_every_client_some_of_every_class(assignment, y, num_clients, num_classes)
    return assignment, {"communities": int(first.shape[0]), "pieces": len(pieces),
                        "pieces_to_the_smallest_client": fallbacks,
                        "nodes_moved_for_classes": moved}


def _give_every_client_some_of_every_class(assignment: np.ndarray, y: np.ndarray,
                                           num_clients: int, num_classes: int) -> int:
    """FedSage+'s class fix-up, in place; returns the number of moves. A client's nodes of a
    class are kept in ascending id order, taken from the back, received at the back."""
    moved = 0
    counts = np.zeros((num_classes, num_clients), dtype=np.int64)
    np.add.at(counts, (y, assignment), 1)
    for k in np.flatnonzero((counts < LOUVAIN_MIN_PER_CLASS).any(axis=1)):
        nodes = np.flatnonzero(y == k)
        members = [nodes[assignment[nodes] == j].tolist() for j in range(num_clients)]
        for short in range(num_clients):
            if len(members[short]) >= LOUVAIN_MIN_PER_CLASS:
                continue
            for donor in range(num_clients):
                if len(members[donor]) > LOUVAIN_MIN_PER_CLASS:
                    node = members[donor].pop()
                    members[short].append(node)
                    moved += donor != short
        for j, owned in enumerate(members):
            assignment[owned] = j
    return moved


def read_assignment_file(path: Path, num_nodes: int) -> np.ndarray:
    """The client of every node from ``path``: an ``.npy`` of integers (``allow_pickle=False``)
    or text with one integer per node (whitespace-separated, ``#`` starts a comment)."""
    flag = f"--partition {FILE_PARTITION}{path}"
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no such file (expected an .npy or a text file with "
                                f"one client id per node)")
    if path.suffix.lower() == ".npy":
        try:
            values = np.load(path, allow_pickle=False)
        except ValueError as exc:
            if "allow_pickle" in str(exc):
                raise ValueError(f"{flag}: an array of Python objects (pickled), expected "
                                 f"integer client ids") from None
            raise ValueError(f"{flag}: not a readable .npy file ({exc})") from None
        except OSError as exc:
            raise ValueError(f"{flag}: not a readable .npy file ({exc})") from None
        if values.dtype.kind not in "iu":
            raise ValueError(f"{flag}: holds dtype {values.dtype}, expected integer client ids")
    else:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{flag}: not a readable text file ({exc})") from None
        tokens = [(number, token) for number, line in enumerate(text.splitlines(), 1)
                  for token in line.split("#", 1)[0].split()]
        try:
            values = np.fromiter((int(token) for _, token in tokens), dtype=np.int64,
                                 count=len(tokens))
        except ValueError:
            number, token = next((nr, t) for nr, t in tokens if not _is_integer(t))
            raise ValueError(f"{flag}: line {number} holds {token!r}, expected an integer "
                             f"client id") from None
    if values.ndim != 1 or values.shape[0] != num_nodes:
        raise ValueError(f"{flag}: {values.shape[0] if values.ndim == 1 else values.shape} "
                         f"client ids, expected {num_nodes} (one per node, in node order)")
    return values.astype(np.int64)


def _is_integer(token: str) -> bool:
    try:
        int(token)
    except ValueError:
        return False
    return True


def check_assignment(assignment: np.ndarray, num_clients: int, origin: str) -> np.ndarray:
    """Client ids in 0..M-1, every client with a node -> int32; ``origin`` names the source."""
    assignment = np.asarray(assignment)
    if assignment.dtype.kind not in "iu":
        raise ValueError(f"{origin}: client ids of dtype {assignment.dtype}, expected integers")
    outside = np.flatnonzero((assignment < 0) | (assignment >= num_clients))
    if outside.size:
        node = int(outside[0])
        raise ValueError(f"{origin}: node {node} has client id {int(assignment[node])}, "
                         f"expected 0..{num_clients - 1} (--num-clients {num_clients})")
    empty = np.flatnonzero(np.bincount(assignment, minlength=num_clients) == 0)
    if empty.size:
        raise ValueError(f"{origin}: client {int(empty[0])} has no node "
                         f"({empty.size} of {num_clients} clients empty), expected every "
                         f"client 0..{num_clients - 1} to hold at least one node")
    return assignment.astype(np.int32)


def cross_edge_fraction(adjacency: sp.csr_matrix, assignment: np.ndarray) -> float:
    """Share of the (undirected) edges whose ends are on different clients."""
    if adjacency.nnz == 0:
        return 0.0
    rows = np.repeat(assignment, np.diff(adjacency.indptr))
    return float(np.count_nonzero(rows != assignment[adjacency.indices]) / adjacency.nnz)


def partition_nodes(graph: GraphData, num_clients: int, config: PartitionConfig, seed: int,
                    show_progress: bool = False) -> Partition:
    n = graph.num_nodes
    if num_clients > n:
        raise ValueError(f"--num-clients {num_clients} exceeds the {n} nodes of {graph.name}: "
                         f"every client needs at least one node")
    start = time.perf_counter()
    with stage(f"partitioning {n:,} nodes into {num_clients} clients ({config.kind})",
               show_progress):
        partition = _partition(graph, num_clients, config, seed)
    partition.seconds = time.perf_counter() - start
    return partition


def _partition(graph: GraphData, num_clients: int, config: PartitionConfig,
               seed: int) -> Partition:
    n = graph.num_nodes
    rng = np.random.default_rng(seed_stream(seed, "partition"))
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
    if config.method == "dirichlet":
        if num_clients * config.min_client_nodes > n:
            raise ValueError(f"--min-client-nodes {config.min_client_nodes} for "
                             f"{num_clients} clients needs {num_clients * config.min_client_nodes}"
                             f" nodes, {graph.name} has {n}; expected at most "
                             f"{n // num_clients}")
        assignment, draws = dirichlet_partition(graph.y, num_clients, graph.num_classes,
                                                config.beta, config.min_client_nodes, seed)
        return Partition(assignment, num_clients, {
            "beta": config.beta, "min_client_nodes": config.min_client_nodes, "draws": draws,
            "draw": "FedGCN label_dirichlet_partition, numpy RandomState(seed)"})
    if config.method == "louvain":
        communities = louvain_communities(graph.adjacency, seed)
        assignment, counts = fedsage_assignment(communities, graph.y, num_clients,
                                                graph.num_classes, config.louvain_delta)
        assignment = check_assignment(assignment, num_clients, "--partition louvain")
        return Partition(assignment, num_clients, {
            "tool": "igraph community_multilevel, FedSage+ louvain_graph_cut",
            "delta": config.louvain_delta, **counts})
    if config.file is not None:
        path = config.file.resolve()
        assignment = check_assignment(read_assignment_file(path, n), num_clients,
                                      f"--partition {config.method}")
        return Partition(assignment, num_clients, {"file": str(path)})
    raise ValueError(f"unknown --partition {config.method!r}; choose one of "
                     f"{', '.join(PARTITION_METHODS)} or {FILE_PARTITION}PATH")
