"""Centralized sampling baselines on the merged graph, with PyG layers:

* GraphSAGE (Hamilton et al., NeurIPS 2017): ``SAGEConv`` (mean aggregation), mini-batches of
  ``--batch-size`` training seeds, neighbour sampling with ``--fanouts`` per hop.
* GraphSAINT (Zeng et al., ICLR 2020): random-walk subgraphs (``--batch-size`` roots, walks of
  ``--walk-length``) with the paper's loss and aggregator normalisations estimated by
  pre-sampling, as PyG's ``GraphSAINTSampler(sample_coverage=...)`` does; ``--saint-coverage 0``
  drops them as OGB's products example does (each subgraph a small graph of its own).

Samplers are numpy: PyG's ``NeighborLoader`` and ``GraphSAINTRandomWalkSampler`` need pyg-lib or
torch-sparse, and neither is installable here (pyg-lib has no PyPI release; torch-sparse is a long
source build against the pinned torch). ``torch_geometric.typing.WITH_PYG_LIB`` and
``WITH_TORCH_SPARSE`` are False in this environment. The sampled subgraph is fed to the PyG convs
as a torch sparse adjacency (PyG's ``adj_t``: one sparse-dense product per layer instead of a
[num_edges, width] message tensor, docs/training.md), so only the sampling is ours. GraphSAGE trims
each layer to the nodes the next one needs, as PyG's ``trim_to_layer`` does.

Epoch = roughly one pass over the data: GraphSAGE takes every training node once as a seed
(shuffled, ceil(n_train / batch) steps); GraphSAINT takes as many subgraphs as make up about n
sampled nodes (round(n / mean subgraph size), the rule behind PyG's example's ``num_steps``).
``--steps-per-epoch`` repeats that pass. Evaluation is a full-graph forward of the same convs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fgl_common.arrays import offsets
from mpifgl.model import (SAGELayer, dropout, layer_type, linear, make_features, relu_dropout,
                          select_rows)
from mpifgl.operators import SparseFeatures, torch_csr
from mpifgl.optim import Adam
from mpifgl.trainer import RankSetup

# Subgraphs drawn to measure the mean subgraph size where nothing is pre-sampled (coverage 0).
SIZE_PROBES = 20
# Never-sampled nodes / edges get this count (PyG's choice), so their weights stay finite.
UNSEEN_COUNT = 0.1


# -- samplers: plain numpy on a CSR adjacency -----------------------------------------------------


def sample_neighbours(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray, fanout: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``fanout`` distinct neighbours of every node, uniformly without replacement.
    Returns (neighbour, node) pairs as two int64 arrays."""
    starts, ends = indptr[nodes], indptr[nodes + 1]
    degrees = ends - starts
    total = int(degrees.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    owner = np.repeat(np.arange(nodes.shape[0]), degrees)
    first = offsets(degrees)[:-1]
    positions = np.arange(total) - first[owner] + starts[owner]
    # A random key per edge; within each node keep the `fanout` smallest = a uniform subset.
    order = np.lexsort((rng.random(total), owner))
    rank = np.arange(total) - first[owner[order]]
    chosen = order[rank < fanout]
    return indices[positions[chosen]].astype(np.int64), nodes[owner[chosen]].astype(np.int64)


class NeighbourSampler:
    """GraphSAGE's sampler, with NeighborLoader's semantics: hop k samples up to fanouts[k]
    neighbours of the nodes first reached at hop k - 1 (the seeds for hop 1); the result is the
    union of sampled edges over the union of nodes, seeds first."""

    def __init__(self, adjacency: sp.csr_matrix, fanouts: list[int], rng: np.random.Generator):
        self.indptr = adjacency.indptr.astype(np.int64)
        # in the CSR's own type, not copied: LLCG's server samples the whole graph with it
        self.indices = adjacency.indices
        self.fanouts = list(fanouts)
        self.rng = rng
        self._position = np.full(adjacency.shape[0], -1, dtype=np.int64)  # reset after each use

    def sample(self, seeds: np.ndarray) -> "NeighbourSample":
        """seeds: distinct node ids. Nodes come seeds first, then by the hop that reached them;
        edges in positions of ``nodes`` (row 0 the neighbour, row 1 the node), hop by hop."""
        seeds = np.asarray(seeds, dtype=np.int64)
        nodes, frontier = [seeds], seeds
        self._position[seeds] = np.arange(seeds.shape[0])
        count = seeds.shape[0]
        sources, targets = [], []
        node_counts, edge_counts = [count], [0]
        for fanout in self.fanouts:
            neighbour, node = sample_neighbours(self.indptr, self.indices, frontier, fanout,
                                                self.rng)
            new = np.unique(neighbour[self._position[neighbour] < 0])
            self._position[new] = count + np.arange(new.shape[0])
            count += new.shape[0]
            nodes.append(new)
            sources.append(self._position[neighbour])
            targets.append(self._position[node])
            frontier = new
            node_counts.append(count)
            edge_counts.append(edge_counts[-1] + neighbour.shape[0])
        all_nodes = np.concatenate(nodes)
        self._position[all_nodes] = -1
        edge_index = np.vstack([np.concatenate(sources), np.concatenate(targets)]).astype(np.int64)
        return NeighbourSample(all_nodes, edge_index, node_counts, edge_counts)


@dataclass
class NeighbourSample:
    """One mini-batch of GraphSAGE. ``node_counts[h]``: nodes reached within h hops (h = 0:
    the seeds); ``edge_counts[h]``: edges sampled in hops 1..h (prefixes of ``edge_index``)."""

    nodes: np.ndarray
    edge_index: np.ndarray
    node_counts: list[int]
    edge_counts: list[int]

    def layer_adjacencies(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """Per layer, the sparse adjacency [targets, sources] it needs and no more (PyG's
        ``trim_to_layer``): layer l of L computes only the nodes within L-1-l hops of the seeds,
        from the edges of hops 1..L-l. The seeds' outputs are those of the untrimmed stack."""
        hops = len(self.node_counts) - 1
        adjacencies = []
        for layer in range(hops):
            keep = self.edge_counts[hops - layer]
            adjacencies.append(torch_adjacency(self.edge_index[:, :keep], None,
                                               self.node_counts[hops - 1 - layer],
                                               self.node_counts[hops - layer], dtype))
        return adjacencies


class RandomWalkSampler:
    """GraphSAINT's random-walk sampler: ``roots`` uniform roots (over all nodes, as PyG), one
    walk of ``walk_length`` uniform steps from each; the subgraph is induced by the visited nodes.
    A node without neighbours stays where it is."""

    def __init__(self, adjacency: sp.csr_matrix, roots: int, walk_length: int,
                 rng: np.random.Generator):
        self.indptr = adjacency.indptr.astype(np.int64)
        self.indices = adjacency.indices.astype(np.int64)
        self.num_nodes = adjacency.shape[0]
        self.roots, self.walk_length, self.rng = roots, walk_length, rng
        # Same structure, data = CSR position + 1: slicing keeps every edge's id.
        self._edge_ids = sp.csr_matrix((np.arange(1, self.indices.shape[0] + 1, dtype=np.int64),
                                        self.indices, self.indptr), shape=adjacency.shape)

    def sample_nodes(self) -> np.ndarray:
        current = self.rng.integers(0, self.num_nodes, self.roots)
        visited = [current]
        for _ in range(self.walk_length):
            degree = self.indptr[current + 1] - self.indptr[current]
            step = np.floor(self.rng.random(current.shape[0]) * degree).astype(np.int64)
            moved = degree > 0
            current = current.copy()
            current[moved] = self.indices[self.indptr[current[moved]] + step[moved]]
            visited.append(current)
        return np.unique(np.concatenate(visited))

    def induced(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges among ``nodes`` (sorted): edge_index [2, e] in positions of ``nodes`` (row 0
        source u, row 1 target v) and the id (CSR position of (v, u)) of every edge."""
        sub = self._edge_ids[nodes][:, nodes].tocoo()
        edge_index = np.vstack([sub.col, sub.row]).astype(np.int64)
        return edge_index, (sub.data - 1).astype(np.int64)

    def sample(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nodes = self.sample_nodes()
        edge_index, edge_ids = self.induced(nodes)
        return nodes, edge_index, edge_ids


def saint_normalisation(sampler: RandomWalkSampler, train_mask: np.ndarray, coverage: float
                        ) -> tuple[np.ndarray, np.ndarray, float]:
    """Estimate GraphSAINT's coefficients from pre-sampled subgraphs (M of them, until
    ``coverage * n`` nodes were drawn in total). With C_v / C_e the number of subgraphs holding
    node v / edge e = (v, u):

    * loss weight of training node v: 1 / (n_train * p_v), p_v = C_v / M, so that the expected
      weighted loss of a subgraph is the mean loss over all training nodes (the centralized
      objective; PyG divides by n instead of n_train, a constant factor);
    * aggregator weight of the message u -> v: C_v / C_e (= p_v / p_{u,v}, the paper's 1/alpha),
      capped at 1e4 as in PyG.

    Returns (loss_weight [n], edge_norm [nnz] per CSR position, mean subgraph size)."""
    n = sampler.num_nodes
    node_count = np.zeros(n, dtype=np.float64)
    edge_count = np.zeros(sampler.indices.shape[0], dtype=np.float64)
    drawn, samples = 0, 0
    while drawn < coverage * n:
        nodes, _, edge_ids = sampler.sample()
        node_count[nodes] += 1
        edge_count[edge_ids] += 1
        drawn += nodes.shape[0]
        samples += 1
    node_count[node_count == 0] = UNSEEN_COUNT
    edge_count[edge_count == 0] = UNSEEN_COUNT
    target = np.repeat(np.arange(n), np.diff(sampler.indptr))  # v of each CSR entry (v, u)
    edge_norm = np.minimum(node_count[target] / edge_count, 1e4)
    n_train = max(1, int(np.asarray(train_mask).sum()))
    loss_weight = samples / (node_count * n_train)
    return loss_weight, edge_norm, drawn / samples


# -- models: PyG convs in a ModuleList called `layers` --------------------------------------------


class PyGStack(nn.Module):
    """``layers`` PyG convs, dropout before each, ReLU between them. Keys: layers.{l}.<conv's>."""

    def __init__(self, make_conv: Callable[[int, int], nn.Module], widths: list[int],
                 dropout_p: float, seed: int, dtype: torch.dtype):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # PyG initialises from the global generator
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(make_conv(widths[k], widths[k + 1])
                                        for k in range(len(widths) - 1))
        self.dropout_p = dropout_p
        self.to(dtype)

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor | list[torch.Tensor],
                rng: np.random.Generator | None = None) -> torch.Tensor:
        """``adjacency``: one sparse [n, n] adjacency (targets x sources, edge weights as values)
        for every layer, or one [n_dst, n_src] per layer (a trimmed mini-batch: each layer's
        first n_dst input rows are its targets). A sparse adjacency makes PyG aggregate with one
        sparse-dense product instead of materialising a [num_edges, width] message tensor."""
        rng = rng if self.training else None
        z = x if rng is None else dropout(x, self.dropout_p, rng)
        for k, layer in enumerate(self.layers):
            layer_adjacency = adjacency[k] if isinstance(adjacency, list) else adjacency
            if isinstance(z, SparseFeatures):
                z = sparse_input_conv(layer, z, layer_adjacency)
            elif isinstance(adjacency, list):
                z = layer((z, z[:layer_adjacency.shape[0]]), layer_adjacency)
            else:
                z = layer(z, layer_adjacency)
            if k < len(self.layers) - 1:  # a conv's fresh output; the next layer's dropout too
                z = relu_dropout(z, self.dropout_p, rng)
        return z


def sparse_input_conv(conv: nn.Module, x: SparseFeatures, adjacency: torch.Tensor) -> torch.Tensor:
    """``conv`` on sparse (bag-of-words) input rows, transforming before aggregating with the
    conv's own parameters: A (X W^T) = (A X) W^T, and X W^T is a sparse product. PyG's convs
    would take X dense, every input row of a batch with a dropout draw per entry
    (docs/training.md); this way the cost follows the non-zeros. Same numbers as the conv on
    dense X (tests/unit/mpifgl/methods/test_sampled.py). ``adjacency``: sparse [n_dst, n_src], targets = the first
    n_dst rows of ``x``."""
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
    n_dst = adjacency.shape[0]
    x_dst = x if n_dst == x.shape[0] else x.rows(torch.arange(n_dst))
    if isinstance(conv, SAGEConv) and conv.aggr == "mean" and conv.root_weight \
            and not conv.project and not conv.normalize:
        counts = adjacency.crow_indices().diff().to(x.dtype).clamp(min=1).unsqueeze(1)
        aggregated = adjacency @ linear(x, conv.lin_l.weight) / counts
        return aggregated + conv.lin_l.bias + linear(x_dst, conv.lin_r.weight)
    if isinstance(conv, GCNConv) and not conv.normalize:
        return adjacency @ linear(x, conv.lin.weight) + conv.bias
    if isinstance(conv, GraphConv) and conv.aggr == "add":
        return adjacency @ linear(x, conv.lin_rel.weight) + conv.lin_rel.bias + \
            linear(x_dst, conv.lin_root.weight)
    raise NotImplementedError(f"{type(conv).__name__} on sparse input features; pass "
                              f"--feature-format dense")


def torch_adjacency(edge_index: np.ndarray, weight: np.ndarray | None, num_targets: int,
                    num_sources: int, dtype: torch.dtype) -> torch.Tensor:
    """PyG's ``adj_t`` as a torch sparse CSR tensor: entry [v, u] = weight of the message u -> v
    (1 when ``weight`` is None). Edges must be distinct."""
    values = np.ones(edge_index.shape[1]) if weight is None else np.asarray(weight, np.float64)
    matrix = sp.csr_matrix((values, (edge_index[1], edge_index[0])),
                           shape=(num_targets, num_sources))
    matrix.sort_indices()
    return torch_csr(matrix, dtype)


def csr_edge_index(adjacency: sp.csr_matrix) -> np.ndarray:
    """[2, nnz] in CSR order: row 0 source u (column), row 1 target v (row)."""
    target = np.repeat(np.arange(adjacency.shape[0]), np.diff(adjacency.indptr))
    return np.vstack([adjacency.indices, target]).astype(np.int64)


def unit_adjacency(adjacency: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    """adj_t[v, u] = 1 per edge u -> v: the CSR itself with unit weights."""
    return torch_csr(sp.csr_matrix((np.ones(adjacency.nnz), adjacency.indices, adjacency.indptr),
                                   shape=adjacency.shape), dtype)


class CentralizedPyGMethod:
    """What GraphSAGE and GraphSAINT share: a PyG stack of ``make_conv`` layers on the whole
    graph's features (dense, or sparse for bag-of-words), Adam, one optimizer step on a sampled
    subgraph, and the full-graph forward on ``full_adjacency`` for evaluation. Each method adds
    its sampler and its pass over the data (``train_step``)."""

    def __init__(self, setup: RankSetup, make_conv: Callable[[int, int], nn.Module],
                 full_adjacency: torch.Tensor):
        config, graph = setup.config, setup.graph
        self.setup = setup
        self.device = setup.device
        self.config = config if config.steps_per_epoch else config.replace(steps_per_epoch=1)
        self.features = make_features(graph.x, setup.dtype, config.feature_format,
                                      device=self.device)
        widths = [graph.x.shape[1]] + [config.hidden] * (config.layers - 1) + [setup.num_classes]
        self.model = PyGStack(make_conv, widths, config.dropout, config.weight_seed,
                              setup.dtype).to(self.device)
        self.optimizer = Adam(self.model.parameters(), lr=config.lr,
                              weight_decay=config.weight_decay)
        self.full_adjacency = full_adjacency.to(self.device)
        self.train_mask = setup.mask("train")

    def step(self, nodes: np.ndarray, adjacency: torch.Tensor | list[torch.Tensor],
             out_rows: int, loss_weight: torch.Tensor | None) -> float:
        """One optimizer step on a sampled subgraph; loss over its first ``out_rows`` rows
        (GraphSAGE's seeds) or over its training nodes weighted by ``loss_weight``."""
        self.model.train()
        self.optimizer.zero_grad()
        index = torch.from_numpy(nodes).to(self.device)
        adjacency = ([a.to(self.device) for a in adjacency] if isinstance(adjacency, list)
                     else adjacency.to(self.device))
        logits = self.model(select_rows(self.features, index), adjacency, self.setup.dropout_rng)
        labels = self.setup.y[index]
        if loss_weight is None:
            loss = F.cross_entropy(logits[:out_rows], labels[:out_rows])
        else:
            train = self.train_mask[index]
            losses = F.cross_entropy(logits[train], labels[train], reduction="none")
            loss = (losses * loss_weight[train]).sum()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        self.model.eval()
        return self.model(self.features, self.full_adjacency)

    # -- checkpoints: the random streams (saved by the Trainer) are all of a rank's own state --
    def rank_state(self) -> dict[str, Any]:
        return {}

    def restore_rank_state(self, state: dict[str, Any]) -> None:
        pass


def require_one_process(setup: RankSetup) -> None:
    if not setup.comm.is_single_process:
        raise ValueError(f"--algo {setup.config.algo} is centralized; it runs in one process")


def sage_conv(in_dim: int, out_dim: int) -> nn.Module:
    from torch_geometric.nn import SAGEConv
    return SAGEConv(in_dim, out_dim, aggr="mean")


class GraphSAGEMethod(CentralizedPyGMethod):
    def __init__(self, setup: RankSetup):
        require_one_process(setup)
        config = setup.config
        fanouts = list(config.fanouts)
        if len(fanouts) != config.layers:
            raise ValueError(f"--fanouts {','.join(map(str, fanouts))} has {len(fanouts)} values, "
                             f"expected one per layer (--layers {config.layers})")
        adjacency = setup.graph.inner.tocsr()
        super().__init__(setup, sage_conv, unit_adjacency(adjacency, setup.dtype))
        self.train_ids = np.flatnonzero(setup.graph.train_mask).astype(np.int64)
        self.neighbour_sampler = NeighbourSampler(adjacency, fanouts, setup.sample_rng)

    def train_step(self) -> float:
        """One pass over the training nodes in shuffled mini-batches; the mean batch loss."""
        order = self.setup.sample_rng.permutation(self.train_ids)
        losses = []
        for start in range(0, order.shape[0], self.config.batch_size):
            seeds = order[start:start + self.config.batch_size]
            batch = self.neighbour_sampler.sample(seeds)
            losses.append(self.step(batch.nodes, batch.layer_adjacencies(self.setup.dtype),
                                    seeds.shape[0], None))
        return float(np.mean(losses)) if losses else 0.0


class GraphSAINTMethod(CentralizedPyGMethod):
    """GraphSAINT on our backbone's layer as its PyG conv (``GraphLayer.pyg_conv``: GCNConv
    without its own normalisation, or GraphConv with sum aggregation; SAGEConv with
    ``--saint-layer sage``), fed pre-normalised edge weights: the message u -> v weighs
    row_scale(v) col_scale(u) (the layer's ``scales`` on whole-graph degrees) times its
    aggregator weight, and the layer's self term is a self loop weighted self_scale(v) (none
    where the layer has no self scale); the self loop is not reweighted (node v's own row
    exists whenever v is sampled).

    With ``--saint-coverage 0`` nothing is pre-sampled: the scales come from the subgraph's own
    degrees and every training node of a subgraph weighs the same in its loss, as in OGB's
    products example (``sample_coverage=0``), whose settings gave the paper's products figure."""

    def __init__(self, setup: RankSetup):
        require_one_process(setup)
        config, graph, self.dtype = setup.config, setup.graph, setup.dtype
        adjacency = graph.inner.tocsr()
        self.walk_sampler = RandomWalkSampler(adjacency, config.batch_size, config.walk_length,
                                              setup.sample_rng)
        self.normalised = config.saint_coverage > 0
        if self.normalised:
            loss_weight, self.edge_norm, mean_size = saint_normalisation(
                self.walk_sampler, graph.train_mask, config.saint_coverage)
            self.loss_weight = torch.from_numpy(loss_weight).to(self.dtype).to(setup.device)
        else:
            mean_size = float(np.mean([self.walk_sampler.sample_nodes().shape[0]
                                       for _ in range(SIZE_PROBES)]))
        self.subgraphs_per_pass = max(1, round(graph.num_nodes / mean_size))
        self.layer_type = (SAGELayer if config.saint_layer == "sage"
                           else layer_type(config.backbone))
        self.base_weight, self.self_weight = self.scaled_weights(
            np.diff(adjacency.indptr), csr_edge_index(adjacency))
        # Evaluation: the whole graph (self loops included where the backbone has them), no
        # sampling weights.
        full_adjacency = self.weighted_adjacency(np.arange(graph.num_nodes),
                                                 csr_edge_index(adjacency), self.base_weight,
                                                 self.self_weight)
        super().__init__(setup, self.layer_type.pyg_conv, full_adjacency)

    def scaled_weights(self, degree: np.ndarray, edge_index: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        """The backbone's weight of every edge (row 0 source u, row 1 target v) on ``degree``,
        and of every node's self loop (None where the backbone has no self term)."""
        degree = torch.from_numpy(np.asarray(degree, dtype=np.float64))
        scales = self.layer_type.scales(degree, torch.ones_like(degree))
        row, col, own = (v.numpy() for v in (scales.row, scales.col, scales.self))
        return row[edge_index[1]] * col[edge_index[0]], (own if np.any(own) else None)

    def weighted_adjacency(self, nodes: np.ndarray, edge_index: np.ndarray, weight: np.ndarray,
                           self_weight: np.ndarray | None) -> torch.Tensor:
        """The subgraph's sparse adjacency with edge weights and, where the backbone has them,
        self loops weighted ``self_weight`` (one per node of ``nodes``)."""
        if self_weight is not None:
            loops = np.arange(nodes.shape[0], dtype=np.int64)
            edge_index = np.hstack([edge_index, np.vstack([loops, loops])])
            weight = np.concatenate([weight, self_weight])
        return torch_adjacency(edge_index, weight, nodes.shape[0], nodes.shape[0], self.dtype)

    def train_step(self) -> float:
        """About one pass over the nodes: subgraphs_per_pass random-walk subgraphs."""
        losses = []
        for _ in range(self.subgraphs_per_pass):
            nodes, edge_index, edge_ids = self.walk_sampler.sample()
            index = torch.from_numpy(nodes).to(self.device)
            if self.normalised:
                weight = self.base_weight[edge_ids] * self.edge_norm[edge_ids]
                self_weight = None if self.self_weight is None else self.self_weight[nodes]
                loss_weight = self.loss_weight[index]
            else:
                degree = np.bincount(edge_index[1], minlength=nodes.shape[0])
                weight, self_weight = self.scaled_weights(degree, edge_index)
                train = int(self.train_mask[index].sum())
                loss_weight = torch.full((nodes.shape[0],), 1.0 / max(1, train),
                                         dtype=self.dtype, device=self.device)
            losses.append(self.step(nodes, self.weighted_adjacency(nodes, edge_index, weight,
                                                                   self_weight),
                                    0, loss_weight))
        return float(np.mean(losses))
