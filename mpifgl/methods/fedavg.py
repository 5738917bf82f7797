"""FedAvg+GCN (McMahan et al., AISTATS 2017) on local subgraphs, and FedAvg with neighbour
collection (the paper's "FedAvg+nc", section 4: each client adds 20% of its cross-client
neighbours to its local graph).

One round per epoch:

1. every client runs ``--local-epochs`` full-batch steps of the backbone on its LOCAL graph with
   its own optimizer state, Adam unless ``--optimizer`` (cross-client edges dropped; degrees and
   GCN normalisation from the local graph, so nothing crosses clients during training);
2. aggregation: the server sums ``n_i * w_i`` and ``n_i`` over clients (one ``sum_to_all`` on a
   flat float64 buffer) and every rank, the server included, continues from
   ``w = sum n_i w_i / sum n_i``, where n_i = number of the client's TRAINING nodes (FedAvg's
   n_k: the examples the local loss is averaged over); ``--client-weights uniform``: n_i = 1 for
   every client with training nodes (FedGCN's and FedSage+'s unweighted mean), 0 for the others;
3. evaluation: each client predicts its own nodes with the averaged model on its local graph
   (all FedAvg can do; this is where local bias shows); counts are summed at the server by
   ``Trainer.evaluate``, and ``--save-logits`` writes these local-graph logits.

The reported loss of a round is the n_i-weighted mean of the clients' local losses over the
round's local epochs. With one client (= the whole graph) and ``--local-epochs 1`` a round is
exactly one step of centralized full-batch training.

FedAvg+nc: at set-up client i draws ``round(nc_fraction * k_i)`` of its k_i distinct one-hop
cross-client neighbours (seeded, without replacement), fetches their features from the owning
clients through the server (pickled messages, once), and adds them as unlabelled nodes with the
edges between them and its own nodes (edges among added nodes are not known to client i and are
not added). Added nodes are never in the loss and never evaluated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mpifgl.communicator import Communicator
from mpifgl.graph import ClientGraph, build_operator
from mpifgl.model import flatten, make_features, unflatten
from mpifgl.registry import CLIENT_WEIGHTS
from mpifgl.tensor_memory import SavedActivations, held_adjacency, tensor_report
from mpifgl.trainer import RankSetup

# -- aggregation: pure functions (tested with hand-computed values) ------------------------------


def fedavg_contribution(params: torch.Tensor, weight: float, loss: float) -> torch.Tensor:
    """What one client adds to the round's sum (float64): [weight * params, weight * loss,
    weight]."""
    return torch.cat([params.to(torch.float64) * weight,
                      torch.tensor([weight * loss, weight], dtype=torch.float64)])


def client_weight(train_nodes: int, rule: str) -> float:
    """A client's weight in the average (``--client-weights``): its training nodes (``train``)
    or 1 (``uniform``); 0 without training nodes either way (it has no loss to train on)."""
    if rule not in CLIENT_WEIGHTS:
        raise ValueError(f"--client-weights {rule!r}, expected one of "
                         f"{', '.join(CLIENT_WEIGHTS)}")
    return float(train_nodes) if rule == "train" else float(train_nodes > 0)


def fedavg_result(summed: torch.Tensor) -> tuple[torch.Tensor, float]:
    """From the sum of contributions: (weighted mean of the parameters, weighted mean loss)."""
    total = float(summed[-1])
    if total <= 0:
        raise ValueError("FedAvg round with total client weight 0 (no training nodes anywhere)")
    return summed[:-2] / total, float(summed[-2]) / total


# -- local graphs --------------------------------------------------------------------------------


@dataclass
class LocalGraph:
    """A client's training graph: its own nodes first (rows 0..n_own-1), then added nodes."""

    graph: ClientGraph  # inner = local adjacency, degree = local degree, no cross part
    x: np.ndarray  # [n_own + k, d]
    num_own: int


def local_graph(graph: ClientGraph, extra_edges: sp.csr_matrix | None = None,
                extra_x: np.ndarray | None = None) -> LocalGraph:
    """The graph a FedAvg client trains on: A_ii plus, optionally, k added nodes joined to its
    own nodes by ``extra_edges`` [n_i, k]. Degrees are counted in this graph only."""
    n_i = graph.num_nodes
    adjacency = graph.inner.tocsr().astype(np.float32)
    x = graph.x
    if extra_edges is not None and extra_edges.shape[1] > 0:
        k = extra_edges.shape[1]
        adjacency = sp.bmat([[adjacency, extra_edges], [extra_edges.T, sp.csr_matrix((k, k))]],
                            format="csr", dtype=np.float32)
        x = np.concatenate([graph.x, np.asarray(extra_x, dtype=graph.x.dtype)])
    adjacency.sort_indices()
    size = adjacency.shape[0]
    degree = np.asarray(adjacency.sum(axis=1)).ravel().round().astype(np.int64)
    empty = np.zeros(size - n_i, dtype=bool)
    view = ClientGraph(
        client_id=0, client_sizes=np.asarray([size], np.int64),
        global_id=np.concatenate([graph.global_id, np.full(size - n_i, -1, np.int64)]),
        x=x, y=np.concatenate([graph.y, np.zeros(size - n_i, np.int64)]),
        train_mask=np.concatenate([graph.train_mask, empty]),
        val_mask=np.concatenate([graph.val_mask, empty]),
        test_mask=np.concatenate([graph.test_mask, empty]),
        degree=degree, inner=adjacency, cross=sp.csr_matrix((size, 0), dtype=np.float32))
    return LocalGraph(view, x, n_i)


def choose_cross_neighbours(graph: ClientGraph, fraction: float,
                            rng: np.random.Generator) -> np.ndarray:
    """Sorted client-ordered ids of round(fraction * k) of the k distinct cross-client
    neighbours, drawn without replacement."""
    candidates = np.unique(graph.cross.indices).astype(np.int64)
    count = int(round(fraction * candidates.shape[0]))
    return np.sort(rng.choice(candidates, size=count, replace=False)).astype(np.int64)


def fetch_features(comm: Communicator, graph: ClientGraph, wanted: np.ndarray) -> np.ndarray:
    """Features [len(wanted), d] of the client-ordered nodes ``wanted``, read by their owners
    and routed through the server (set-up only: pickled calls). Collective on every rank."""
    offsets = graph.offsets
    requests = comm.gather_objects(wanted)
    asks = None
    if comm.is_server:  # rank r serves client r - 1; the server is asked nothing
        union = np.unique(np.concatenate(requests)) if requests else np.zeros(0, np.int64)
        owner = np.searchsorted(offsets, union, side="right") - 1
        asks = [np.zeros(0, np.int64)] + [union[owner == j] - offsets[j]
                                          for j in range(graph.num_clients)]
    asked = comm.scatter_objects(asks)
    replies = comm.gather_objects(graph.x[asked] if comm.is_client else None)
    answers = None
    if comm.is_server:
        width = graph.x.shape[1]
        table = {}
        for j in range(graph.num_clients):
            for local, row in zip(asks[j + 1], replies[j + 1]):
                table[int(offsets[j] + local)] = row
        answers = [np.asarray([table[int(u)] for u in ids], dtype=graph.x.dtype).reshape(-1, width)
                   for ids in requests]
    return comm.scatter_objects(answers)


# -- the method ----------------------------------------------------------------------------------

class FedAvgMethod:
    """One rank's side of FedAvg: its local graph, the backbone model and its own optimizer state.
    ``collect_neighbours`` (FedAvg+nc): add a share of the cross-client neighbours at set-up.
    Nothing is exchanged after set-up but the round's weighted sum."""

    def __init__(self, setup: RankSetup, collect_neighbours: bool = False,
                 local: LocalGraph | None = None):
        """``local``: the graph to train on, made by the caller (FedSage+'s mended graph)."""
        config, comm, graph = setup.config, setup.comm, setup.graph
        if setup.global_split_counts["train"] == 0:
            raise ValueError(f"--algo {config.algo} needs training nodes: the shards have none")
        self.setup, self.comm = setup, comm
        self.config = config if config.steps_per_epoch else config.replace(steps_per_epoch=1)
        self.model, self.optimizer = setup.gnn_and_optimizer()
        self.collected = np.zeros(0, np.int64)  # client-ordered ids added (FedAvg+nc)
        self.local = local if local is not None else (
            self._collect_neighbours() if collect_neighbours else local_graph(graph))
        device = setup.device
        self.local_x = make_features(self.local.x, setup.dtype, config.feature_format,
                                     device=device)
        self.local_y = torch.from_numpy(self.local.graph.y).to(device)
        self.local_train = torch.from_numpy(self.local.graph.train_mask).to(device)
        self.local_operator = build_operator(self.local.graph, config.backbone, None, None,
                                             setup.dtype, False, device)
        # n_i: local training nodes (or 1 per client, --client-weights uniform)
        self.weight = client_weight(int(graph.train_mask.sum()), config.client_weights)
        self.activations = SavedActivations([*self.model.parameters(), self.local_x]
                                            if isinstance(self.local_x, torch.Tensor)
                                            else self.model.parameters())

    def _collect_neighbours(self) -> LocalGraph:
        """Collective: chosen neighbours' features come from their owners via the server."""
        graph = self.setup.graph
        if self.comm.is_client:
            self.collected = choose_cross_neighbours(graph, self.config.nc_fraction,
                                                     self.setup.sample_rng)
        features = fetch_features(self.comm, graph, self.collected)
        if not self.comm.is_client:
            return local_graph(graph)
        edges = graph.cross[:, self.collected].tocsr() if self.collected.size else None
        return local_graph(graph, edges, features)

    # -- one round ----------------------------------------------------------------------------
    def local_step(self) -> float:
        """One full-batch step on the local graph with this client's own optimizer."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        with self.activations.measure():
            logits = self.model(self.local_x, self.local_operator, self.setup.dropout_rng)
            loss = F.cross_entropy(logits[self.local_train], self.local_y[self.local_train])
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def train_step(self) -> float:
        """One round: local epochs on every client, then the weighted average everywhere."""
        if self.comm.is_client and self.weight > 0:
            loss = float(np.mean([self.local_step() for _ in range(self.config.local_epochs)]))
        else:
            loss = 0.0
        weight = self.weight if self.comm.is_client else 0.0
        parameters = list(self.model.parameters())
        trained = flatten(parameters)
        # mpifgl.finite: this rank's own loss and parameters, checked before the sum mixes them
        self.setup.finite.before_sum(loss, trained, self.model, "parameter after local training")
        summed = self.comm.sum_to_all(fedavg_contribution(trained.cpu(), weight, loss))
        average, mean_loss = fedavg_result(summed.to(self.setup.device))
        with torch.no_grad():
            for p, value in zip(parameters, unflatten(average, parameters)):
                p.copy_(value)
        return mean_loss

    # -- evaluation: own nodes only, local graph ------------------------------------------------
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        self.model.eval()
        return self.model(self.local_x, self.local_operator)[:self.local.num_own]

    # -- what the run reports -------------------------------------------------------------------
    def rank_report(self) -> dict[str, Any]:
        """This rank's tensors by kind (``mpifgl.tensor_memory.tensor_report``): its local
        graph's features and operator beside the shard it loaded, autograd's saved tensors,
        and the round's two flat float64 vectors (its contribution and the sum)."""
        parameters = sum(p.numel() for p in self.model.parameters())
        return {"tensor_bytes": tensor_report(
            [self.setup.graph.x, self.local.x, self.local_x],
            [held_adjacency(self.setup.graph), held_adjacency(self.local.graph),
             self.local_operator.inner], self.activations.peak, None, self.model,
            self.optimizer, more_buffer_bytes=2 * (parameters + 2) * 8)}

    # -- checkpoints: every client's optimizer state is its own ---------------------------------
    def rank_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def restore_rank_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def build_fedavg(setup: RankSetup) -> FedAvgMethod:
    return FedAvgMethod(setup)


def build_fedavg_nc(setup: RankSetup) -> FedAvgMethod:
    return FedAvgMethod(setup, collect_neighbours=True)
