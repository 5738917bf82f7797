"""Label-guided node sampling (paper section 2.2, eq. 4). Plain numpy, no MPI.

Decisions (docs/design.md section 1 asks for them to be stated and tested):

* Groups. Q is driven by *training* labels only, the only labels a transductive client may use.
  Every node without a training label (validation, test, unlabelled) falls in one extra group,
  index ``num_classes``. So ``group(u) = y(u)`` for training nodes, ``num_classes`` otherwise.
* Q_i(u) = n^{g(u)} / (n_i^{g(u)} * sum_{k present on client i} n^k): each group present on the
  client gets mass proportional to its GLOBAL size, spread evenly over its local members. Q_i sums
  to one over the client's nodes. The global counts n^k come from one reduction at set-up.
* Sizes. s_i = n_i s / n, rounded by largest remainder so that the s_i add up to s exactly.
* Draws are with replacement; the sample is the set of distinct nodes drawn, and the inclusion
  probability is p(u) = 1 - (1 - Q_i(u))^{s_i}.
* Normalisation. A neighbour u's message is divided by p(u) (eq. 4). A node's own self-loop term is
  NOT divided: the output row of v exists only when v is sampled, so conditional on that the
  self term is always present, and dividing it would bias the estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpifgl.registry import SAMPLINGS, lookup


def node_groups(y: np.ndarray, train_mask: np.ndarray, num_classes: int) -> np.ndarray:
    """Group index per node: the training label, or ``num_classes`` for non-training nodes."""
    return np.where(train_mask, y, num_classes).astype(np.int64)


def group_counts(groups: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts of each group, length num_classes + 1 (the last is the non-training group)."""
    return np.bincount(groups, minlength=num_classes + 1).astype(np.int64)


def label_guided_distribution(groups: np.ndarray, global_counts: np.ndarray) -> np.ndarray:
    """Q_i over one client's nodes (float64 [n_i], sums to 1).

    groups: int [n_i] group of each local node; global_counts: int [G] counts over all clients."""
    if groups.size == 0:
        return np.zeros(0, dtype=np.float64)
    local_counts = np.bincount(groups, minlength=global_counts.shape[0])
    present = local_counts > 0
    if np.any(global_counts[present] < local_counts[present]):
        raise ValueError("a group's global count is smaller than its local count: the global "
                         "counts do not include this client")
    mass = global_counts[present].sum()
    q = global_counts[groups] / (local_counts[groups] * float(mass))
    return q


def uniform_distribution(groups: np.ndarray, global_counts: np.ndarray) -> np.ndarray:
    """Every local node equally likely (float64 [n_i]); the counts are not used."""
    num_nodes = groups.shape[0]
    return np.full(num_nodes, 1.0 / num_nodes) if num_nodes else np.zeros(0)


def client_sample_sizes(client_sizes: list[int] | np.ndarray, total: int) -> np.ndarray:
    """s_i = n_i * s / n rounded by largest remainder; sums to ``total`` exactly."""
    sizes = np.asarray(client_sizes, dtype=np.int64)
    n = int(sizes.sum())
    if n == 0:
        return np.zeros_like(sizes)
    exact = sizes * (total / n)
    floors = np.floor(exact).astype(np.int64)
    short = int(total - floors.sum())
    order = np.argsort(-(exact - floors), kind="stable")
    floors[order[:short]] += 1
    return floors


# Above this many nodes --sample-size 0 depends on the layer. GCN and 1-GNN draw n nodes in one
# step per epoch with the first layer exact: on the products proxy that keeps centralized's
# accuracy where the paper's sample fraction loses it, at about the time and a fraction of the
# bytes of four steps (docs/paper_scale.md, section 5). Up to it (the paper's PubMed, 19,717, and
# every graph of the study) the default stays the paper's n/4.
LARGE_GRAPH_NODES = 20_000
# Layers that keep the paper's sample fraction (eq. 4, n/5 per step) above LARGE_GRAPH_NODES:
# with a node's own row weighted apart, that sample's noise lifts the model above full batch and
# the one-step sample falls below it (docs/paper_scale.md, section 9). 1-GNN, which weighs its
# own row apart too but sums its neighbours unnormalised, keeps the one-step rule: there the
# one-step sample tracks full batch and the paper's fraction does not (section 5).
PAPER_FRACTION_BACKBONES = ("sage",)
PAPER_FRACTION_STEPS = 5  # the paper's 500,000 of products' 2,449,029 nodes per step


def one_step_exact_first(num_nodes: int, backbone: str) -> bool:
    """Whether --sample-size 0 is one step of n draws with the first layer exact."""
    return num_nodes > LARGE_GRAPH_NODES and backbone not in PAPER_FRACTION_BACKBONES


def default_sample_size(num_nodes: int, backbone: str) -> int:
    """The draws s of --sample-size 0: ceil(n / 4) up to LARGE_GRAPH_NODES nodes; above, n
    (one_step_exact_first) or ceil(n / 5) for PAPER_FRACTION_BACKBONES."""
    if num_nodes <= LARGE_GRAPH_NODES:
        return max(1, -(-num_nodes // 4))
    return num_nodes if one_step_exact_first(num_nodes, backbone) else \
        -(-num_nodes // PAPER_FRACTION_STEPS)


def steps_for_sample(num_nodes: int, sample_size: int) -> int:
    """Steps of one pass over the nodes: ceil(n / s), with a tolerance so that s = ceil(n / 4)
    gives exactly 4 and float rounding of n / s never adds a step."""
    return max(1, int(np.ceil(num_nodes / sample_size - 1e-6)))


def inclusion_probability(q: np.ndarray, draws: int) -> np.ndarray:
    """p(u) = 1 - (1 - Q(u))^draws, computed stably for tiny Q."""
    with np.errstate(divide="ignore"):
        return -np.expm1(draws * np.log1p(-np.clip(q, 0.0, 1.0)))


@dataclass
class NodeSample:
    """One client's sample: sorted distinct local indices and their inclusion probabilities."""

    index: np.ndarray  # int64 [k], sorted, distinct
    probability: np.ndarray  # float64 [k], p(u) of each sampled node (1 when not normalising)


class NodeSampler:
    """Draws one client's node sample per step from Q_i (label-guided or uniform)."""

    def __init__(self, distribution: np.ndarray, draws: int, rng: np.random.Generator,
                 normalize: bool = True):
        self.distribution = distribution
        self.draws = int(draws)
        self.rng = rng
        self.normalize = normalize
        self.inclusion = inclusion_probability(distribution, self.draws)

    def sample(self) -> NodeSample:
        n = self.distribution.shape[0]
        if n == 0 or self.draws == 0:
            return NodeSample(np.zeros(0, np.int64), np.zeros(0))
        drawn = self.rng.choice(n, size=self.draws, replace=True, p=self.distribution)
        seen = np.zeros(n, dtype=bool)  # distinct and sorted in one pass: np.unique sorts draws
        seen[drawn] = True
        index = np.flatnonzero(seen).astype(np.int64, copy=False)
        probability = self.inclusion[index] if self.normalize else np.ones(index.shape[0])
        return NodeSample(index, probability)


# partitions whose clients are communities: a class need not look alike on every client, which
# the label-guided Q assumes (P(X|Y) alike across clients); measured in docs/results.md
COMMUNITY_PARTITIONS = ("louvain", "metis")


def community_sampler_note(partition: str | None, sampling: str, chosen: bool) -> str | None:
    """The warning for a run whose label-guided sampler was not chosen explicitly (``chosen``)
    on shards partitioned into communities; None otherwise."""
    if sampling != "label" or chosen or partition not in COMMUNITY_PARTITIONS:
        return None
    return (f"the shards' partition is {partition} (communities), where the label-guided "
            "sampler fell below centralized and --sampling uniform did not (docs/results.md, "
            "\"Figure 4 on Louvain clients\", and METIS); pass --sampling uniform, or "
            "--sampling label to keep it and silence this")


def make_distribution(kind: str, groups: np.ndarray, global_counts: np.ndarray) -> np.ndarray:
    """Q_i of ``--sampling kind`` (one of the registry's samplings that draw nodes)."""
    entry = lookup(SAMPLINGS, "sampling", kind)
    if not entry.path:
        raise ValueError(f"--sampling {kind!r} draws no nodes (the full graph every step)")
    return entry.load()(groups, global_counts)
