"""FedGCN (Yao et al., NeurIPS 2023): one pre-training round that gives every client sums of
its neighbours' features, then FedAvg. References: yh-yao/FedGCN (the paper's code, which
simulates the round by handing each client the raw features of its neighbourhood) and FedGraph
(FedGraph/fedgraph: ``Trainer_General.get_local_feature_sum``, the pre-training phase of
``run_NC``, the ``AggreGCN`` model), whose messages this module follows.

The round (``--hops 1`` or ``2``) computes rows of R = (A + I) [X | 1]: FedGraph's default sums
(``norm_type="none"``: the features of a node and of its neighbours, unnormalised) plus a
column of ones, whose sum is every node's whole-graph degree with its self loop, d~ = deg + 1.
``--round-norm`` row or sym (FedGraph's other ``norm_type`` values) weights the feature columns
(``round_weights``): each client weights the rows it sends by its own nodes' degrees, and each
owner its completed rows before they are relayed, so the weights need no message of their own.
Client k's contribution to the row of a node v is the sum of the rows of its own nodes in v's
closed neighbourhood. In two exchanges through the server (``mpifgl.exchange``'s compact
exchange: each client sends only its non-zero rows, with their ids once, Gatherv; the server
sums them per row in client order; each receiver gets its rows, Scatterv; no tree reduce, so no
client ever holds another's partial sum; with ``--secure`` both run masked and the server sees
uniform ring words):

1. own rows: client k's rows of its own nodes are its local part (A_kk + I) Z_k plus the other
   clients' terms A_kj Z_j, sent for k's boundary nodes (the cross-client plan of the full
   graph, ``CrossExchangePlan.of_full_graph``);
2. ``--hops 2`` only: the rows of k's external neighbours (its nodes' one-hop neighbours held
   by other clients), each sent by its owner, which completed it in phase 1, once per client
   that needs it (``relay_plan``: one sender per row, so the server's sum relays it).

FedGraph's message is one exchange: every client sends (A_k + I) X_k on all rows it touches,
its own nodes' included, and the server returns the summed rows of C_k. The rows here are the
same sums; what differs is who sees what: a client's terms for its own nodes never leave it,
and a row reaches the server summed over clients only where another client needs it. Why two
exchanges: masked, a message is for one receiver (pairwise keystreams), and in one exchange a
receiver would have to know which clients touched each external neighbour's row, i.e. that
node's edges to third clients, which it does not hold.

The model (FedGraph's ``AggreGCN``): a linear layer on the pre-aggregated rows, ReLU, dropout,
then ``--layers - 1`` graph layers of ``--backbone`` (GCN: FedGraph's GCNConv) with ReLU and
dropout between them; loss and evaluation on the client's own nodes. ``--hops 2``: the graph
layers run on C_k = own nodes + external neighbours with the edges the client holds (own-own,
own-external) and the last layer's output is computed for the own rows only; normalised with
the round's whole-graph degrees. ``--hops 1``: C_k = the own nodes, the client's own graph and
its degrees (GCNConv on the adjacency it is given). ``--hops 0``: no round, FedGraph's FedAvg
path: graph layers only, on the raw features of the own graph (dropout between layers).

Training is FedAvg's round (``fedavg.FedAvgMethod``, whose round, evaluation and checkpoint
state this class inherits): ``--local-epochs`` full-batch steps per round on every client with
its optimizer, then the average weighted by ``--client-weights``. The reference settings are
the method's defaults (``mpifgl.registry``): SGD lr 0.5, weight decay 5e-4, 3 local steps,
hidden 16, dropout 0.5, the unweighted mean.

Departures from the references (docs/algorithms.md):

* the round is two exchanges (above), with the same rows;
* the edges between a client's external neighbours: the references give a client the edges
  among all of C_k, a client here holds none between two external nodes. With the round's
  whole-graph degrees they change nothing a 2-layer model computes for an own node (its output
  needs its own and its neighbours' rows and degrees only): client k's own-node logits equal
  those of the same model on the whole graph (``tests/unit/mpifgl/methods/test_fedgcn.py``).
  With ``--layers`` > 2 the hidden rows of external nodes miss their edges to every node that
  is not the client's (in the references: to nodes outside C_k);
* the degrees of external neighbours: whole-graph (the references count them in C_k's induced
  graph, which misses their edges to nodes outside C_k);
* initial weights: the same on every client (yh-yao/FedGCN broadcasts the server's; FedGraph
  seeds each trainer apart and averages after the first round); the linear layer drawn from
  torch.nn.Linear's bounds with this run's seed, the graph layers as the backbone draws them;
* a client without training nodes does not train and has weight 0 (the references average
  every trainer, and the mean loss of none is NaN in torch);
* no dropout on the input features (as the references' models): ``fedavg``'s GNN drops them
  too, so ``--hops 0`` equals ``fedavg`` with FedGCN's settings at ``--dropout 0``, and differs
  from it at p > 0 by that input dropout only;
* the references' evaluation reports the last round's test accuracy; here test micro-F1 at the
  best validation epoch (``mpifgl.trainer``), as for every method; their Dirichlet label split
  (beta = 10000: about iid) is data_prep's business here (``--partition``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from mpifgl.communicator import Communicator
from mpifgl.config import ROUND_NORMS
from mpifgl.exchange import build_exchange
from mpifgl.graph import ClientGraph, CrossExchangePlan, build_operator
from mpifgl.methods.fedavg import FedAvgMethod, client_weight, local_graph
from mpifgl.model import LayerOperator, layer_type, linear, make_features, relu_dropout
from mpifgl.operators import CSRArrays, SparseMatrix, SparseOperator, numpy_dtype
from mpifgl.registry import METHODS
from mpifgl.secure import SecureSession
from mpifgl.tensor_memory import SavedActivations, held_adjacency, tensor_report
from mpifgl.trainer import PhaseTraffic, RankSetup

ROUND = "pretrain"  # the slots of the round's exchanges, and its keys in metrics and final.json


# -- the pre-training round ----------------------------------------------------------------------

@dataclass
class PreAggregated:
    """What the round gives a client: rows of R = (A + I) [X | 1] for C_k, its own nodes first
    (local order), then its external neighbours (``--hops 2``) in ascending client-ordered id."""

    table: np.ndarray  # [n_k + e, d + 1]
    external: np.ndarray  # int64 [e]: client-ordered ids of the external neighbours

    @property
    def features(self) -> np.ndarray:
        """R's feature columns, (A + I) X: a view, no copy."""
        return self.table[:, :-1]

    @property
    def degree(self) -> np.ndarray:
        """int64 whole-graph degrees (self loop not counted) of C_k's nodes, from the ones."""
        return np.rint(self.table[:, -1]).astype(np.int64) - 1


def relay_plan(graph: ClientGraph, external: np.ndarray, dtype: torch.dtype
               ) -> CrossExchangePlan:
    """Phase 2 as one compact exchange: owner j sends the row of its node u (client-ordered id)
    to every other client k that holds a neighbour of u, at position k * n + u of m segments of
    n positions (one per receiver). Every position has one sender, so the server's sum is a
    relay; receiver k's receive rows are its ``external`` neighbours (ascending client-ordered
    ids), written to rows 0..e-1 of the exchange's result, and it knows each one's sender (the
    owner)."""
    n, m, own = int(graph.client_sizes.sum()), graph.num_clients, graph.client_id
    offsets = graph.offsets
    cross = graph.cross
    owner = np.searchsorted(offsets, cross.indices, side="right") - 1  # of each neighbour
    row = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(cross.indptr))
    # a row's entries ascend by column, so by owner: the first entry of each (row, owner) run
    first = np.ones(owner.shape[0], dtype=bool)
    first[1:] = (owner[1:] != owner[:-1]) | (row[1:] != row[:-1])
    positions = np.sort(owner[first] * n + offsets[own] + row[first])
    del owner, row, first
    sent = positions.shape[0]
    send = CSRArrays(np.arange(sent + 1, dtype=np.int64), positions % n - offsets[own],
                     np.ones(sent), (sent, graph.num_nodes)).compact_indices()
    sender = np.searchsorted(offsets, external, side="right") - 1
    senders = [None if j == own else np.flatnonzero(sender == j) for j in range(m)]
    return CrossExchangePlan(SparseMatrix(send, dtype), positions.astype(np.int64),
                             np.arange(external.shape[0], dtype=np.int64),
                             np.full(m, n, dtype=np.int64), own, receive_senders=senders)


def round_weights(degree: np.ndarray, norm: str) -> tuple[np.ndarray, np.ndarray] | None:
    """FedGraph's ``norm_type`` as the weight of a row where it is sent (source) and where it is
    summed (target), from the whole-graph ``degree`` of the client's own nodes: the weight of
    edge u -> v is source[u] * target[v], of the self loop source[v] * target[v]. ``none``:
    None (all 1); ``row``: 1 / d~(u) and 1 (FedGraph's edge and self weights 1 / d~); ``sym``:
    d~^-1/2 at both ends (self 1 / d~). d~ = degree + 1."""
    if norm not in ROUND_NORMS:
        raise ValueError(f"--round-norm is {norm!r}, expected one of {', '.join(ROUND_NORMS)}")
    if norm == "none":
        return None
    tilde = degree.astype(np.float64) + 1.0
    if norm == "row":
        return 1.0 / tilde, np.ones_like(tilde)
    return tilde ** -0.5, tilde ** -0.5  # sym


def pre_training_round(comm: Communicator, graph: ClientGraph, hops: int, dtype: torch.dtype,
                       buffer_bytes: int, masking: SecureSession | None,
                       norm: str = "none") -> PreAggregated | None:
    """The round (collective on every rank; the server's result is None). ``hops`` 1: the own
    rows; 2: and the rows of the external neighbours. ``norm``: ``round_weights``, on the
    feature columns only (the ones column stays the degree)."""
    width = graph.x.shape[1] + 1
    exchange = build_exchange(comm, "compact", buffer_bytes, width, dtype, masking)
    n, m = int(graph.client_sizes.sum()), graph.num_clients
    if not comm.is_client:
        for phase, plan in enumerate([CrossExchangePlan.of_server(graph.client_sizes)] +
                                     [CrossExchangePlan.of_server(np.full(m, n))] * (hops - 1)):
            exchange.prepare(plan)
            exchange.run(plan, torch.zeros((0, width), dtype=dtype), (ROUND, "forward", phase))
        return None
    n_k = graph.num_nodes
    external = (np.unique(graph.cross.indices).astype(np.int64) if hops == 2
                else np.zeros(0, np.int64))
    # before the table is filled: the plan's own peak comes first
    relay = relay_plan(graph, external, dtype) if hops == 2 else None
    z = np.empty((n_k, width), dtype=numpy_dtype(dtype))
    z[:, :-1], z[:, -1] = graph.x, 1.0
    weights = round_weights(graph.degree, norm)  # (source, target) per own node, or None
    if weights is not None:
        z[:, :-1] *= weights[0][:, None].astype(z.dtype)
    table = np.zeros((n_k + external.shape[0], width), dtype=z.dtype)
    table[:n_k] = graph.inner.astype(z.dtype) @ z + z  # the local part, (A_kk + I) Z_k
    rows = torch.from_numpy(table)
    plan = CrossExchangePlan.of_full_graph(graph, dtype)
    exchange.prepare(plan)
    exchange.run(plan, torch.from_numpy(z), (ROUND, "forward", 0), rows[:n_k])
    del plan, z
    if weights is not None:  # the own rows are complete: weighted before they are relayed
        table[:n_k, :-1] *= weights[1][:, None].astype(table.dtype)
    vars(graph).pop("cross_transposed", None)  # the round's plan only: not kept for the run
    if relay is not None:
        exchange.prepare(relay)
        exchange.run(relay, rows[:n_k], (ROUND, "forward", 1), rows[n_k:])
    return PreAggregated(table, external)


# -- the model -------------------------------------------------------------------------------------

@dataclass
class FedGCNOperators:
    """A client's operators: ``graph`` over its training graph (every row); ``own`` (``--hops
    2``): the last layer's, its own rows out of C_k's columns; ``num_own`` rows come out."""

    graph: LayerOperator | None
    own: LayerOperator | None
    num_own: int


class FedGCNModel(nn.Module):
    """FedGraph's AggreGCN (``pre_aggregated``: Linear on the round's rows, then graph layers)
    or its GCN (``--hops 0``: graph layers only); ReLU and dropout between layers, none on the
    input. Initial weights from ``seed`` alone, drawn in layer order from one generator: at
    ``--hops 0`` those of ``mpifgl.model.GNN`` with the same seed."""

    def __init__(self, backbone: str, in_dim: int, hidden: int, out_dim: int, layers: int,
                 dropout_p: float, seed: int, dtype: torch.dtype, pre_aggregated: bool):
        super().__init__()
        graph_layer = layer_type(backbone)
        widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.first = nn.Linear(in_dim, widths[1]) if pre_aggregated else \
            graph_layer(in_dim, widths[1])
        self.layers = nn.ModuleList(graph_layer(widths[k], widths[k + 1])
                                    for k in range(1, layers))
        self.dropout_p = dropout_p
        generator = torch.Generator().manual_seed(seed)
        if pre_aggregated:
            _linear_reset(self.first, generator)
        else:
            self.first.reset(generator)
        for layer in self.layers:
            layer.reset(generator)
        self.to(dtype)

    def forward(self, x, op: FedGCNOperators, rng=None) -> torch.Tensor:
        """x: the client's input rows -> logits of its own nodes [op.num_own, out_dim]
        (--hops 0 and 1: every row is an own node). Dropout where ``rng`` is given, training."""
        rng = rng if self.training else None
        if isinstance(self.first, nn.Linear):
            h = linear(x, self.first.weight).add_(self.first.bias)
        else:
            h = self.first(x, op.graph)
        for k, layer in enumerate(self.layers):
            h = relu_dropout(h, self.dropout_p, rng)
            if k == len(self.layers) - 1 and op.own is not None:
                # aggregated first, then transformed (M is linear): the [C_k, d] tensors are
                # hidden-wide, and only the own rows are computed
                aggregate = layer.propagate(h * op.own.col_scale, op.own)
                h = layer.forward_aggregated(h[:op.num_own], aggregate, op.own)
            else:
                h = layer(h, op.graph)
        return h


def _linear_reset(layer: nn.Linear, generator: torch.Generator) -> None:
    """torch.nn.Linear's initial weights and bias, U(-1/sqrt(in), 1/sqrt(in)), drawn from
    ``generator`` (every rank the same)."""
    bound = 1.0 / math.sqrt(layer.in_features)
    with torch.no_grad():
        for p in (layer.weight, layer.bias):
            p.copy_(torch.rand(p.shape, generator=generator, dtype=torch.float64)
                    .mul_(2 * bound).sub_(bound).to(p.dtype))


def own_rows_operator(graph: ClientGraph, external: np.ndarray, degree: np.ndarray,
                      backbone: str, dtype: torch.dtype, device: torch.device) -> LayerOperator:
    """The last layer's operator at ``--hops 2``: rows = own nodes, columns = C_k (own nodes,
    then ``external``), [A_kk | A_k,external], scaled by the whole-graph ``degree`` of C_k."""
    n_k = graph.num_nodes
    adjacency = sp.hstack([graph.inner, graph.cross[:, external]], format="csr",
                          dtype=np.float32)
    adjacency.sort_indices()
    scales = layer_type(backbone).scales(torch.from_numpy(degree.astype(np.float64)),
                                         torch.ones(degree.shape[0], dtype=torch.float64))
    as_col = lambda v: v.to(device=device, dtype=dtype)[:, None]  # noqa: E731
    return LayerOperator(torch.arange(n_k, device=device),
                         SparseOperator(CSRArrays.of(adjacency), dtype, device),
                         as_col(scales.row[:n_k]), as_col(scales.col), as_col(scales.self[:n_k]))


def closed_graph(graph: ClientGraph, external: np.ndarray, degree: np.ndarray) -> ClientGraph:
    """C_k as a graph of its own (own nodes, then ``external``) with the edges the client holds
    and the whole-graph ``degree``: the hidden layers' graph at ``--hops 2`` with --layers > 2."""
    to_external = graph.cross[:, external].tocsr().astype(np.float32)
    size = graph.num_nodes + external.shape[0]
    adjacency = sp.bmat([[graph.inner, to_external], [to_external.T, None]], format="csr",
                        dtype=np.float32)
    adjacency.sort_indices()
    none = np.zeros(size, dtype=bool)
    return ClientGraph(0, np.asarray([size], np.int64), np.arange(size, dtype=np.int64),
                       np.zeros((size, 0), np.float32), np.zeros(size, np.int64), none, none,
                       none, degree, adjacency, sp.csr_matrix((size, 0), dtype=np.float32))


# -- the method ------------------------------------------------------------------------------------

class FedGCNMethod(FedAvgMethod):
    """One rank's side of FedGCN: the round at set-up, then FedAvg's rounds on the client's
    FedGCN model. It sets every attribute FedAvg's round, evaluation and checkpoints read
    (``local``, ``local_x``, ``local_y``, ``local_train``, ``local_operator``, ``weight``, the
    model and its optimizer), its own way, instead of FedAvg's set-up."""

    def __init__(self, setup: RankSetup):
        config, comm, graph = setup.config, setup.comm, setup.graph
        if setup.global_split_counts["train"] == 0:
            raise ValueError(f"--algo {config.algo} needs training nodes: the shards have none")
        hops = config.hops if config.hops is not None else METHODS[config.algo].default("hops")
        self.setup, self.comm, self.hops = setup, comm, hops
        self.config = config.replace(hops=hops, steps_per_epoch=config.steps_per_epoch or 1)
        self.collected = np.zeros(0, np.int64)
        self.local = local_graph(graph)
        device, dtype = setup.device, setup.dtype
        self.setup_record = None
        round_result = None
        if hops > 0:
            traffic = PhaseTraffic(comm)
            round_result = pre_training_round(comm, graph, hops, dtype,
                                              int(config.exchange_buffer_mb * 2 ** 20),
                                              setup.masking, config.round_norm)
            self.setup_record = traffic.record(ROUND)
        self.model = FedGCNModel(config.backbone, graph.x.shape[1], config.hidden,
                                 setup.num_classes, config.layers, config.dropout,
                                 config.weight_seed, dtype, pre_aggregated=hops > 0).to(device)
        self.optimizer = setup.optimizer_of(self.model)
        features = graph.x if round_result is None else round_result.features
        self.local_x = make_features(features, dtype, config.feature_format, device=device)
        self.local_y = torch.from_numpy(graph.y).to(device)
        self.local_train = torch.from_numpy(graph.train_mask).to(device)
        self.local_operator = self._operators(round_result)
        self.weight = client_weight(int(graph.train_mask.sum()), config.client_weights)
        self.activations = SavedActivations([*self.model.parameters(), self.local_x]
                                            if isinstance(self.local_x, torch.Tensor)
                                            else self.model.parameters())

    def _operators(self, round_result: PreAggregated | None) -> FedGCNOperators:
        config, graph, device, dtype = self.config, self.setup.graph, self.setup.device, \
            self.setup.dtype
        if self.hops < 2 or round_result is None:  # the own graph, its own degrees
            return FedGCNOperators(build_operator(self.local.graph, config.backbone, None, None,
                                                  dtype, False, device), None, graph.num_nodes)
        external, degree = round_result.external, round_result.degree
        hidden = None
        if config.layers > 2:
            hidden = build_operator(closed_graph(graph, external, degree), config.backbone,
                                    None, None, dtype, False, device)
        return FedGCNOperators(hidden, own_rows_operator(graph, external, degree,
                                                         config.backbone, dtype, device),
                               graph.num_nodes)


    def rank_report(self) -> dict[str, Any]:
        """This rank's tensors by kind (``mpifgl.tensor_memory.tensor_report``): the shard's
        graph and features beside the round's rows and the client's operators, autograd's saved
        tensors and FedAvg's two flat float64 vectors."""
        parameters = sum(p.numel() for p in self.model.parameters())
        operators = [op.inner for op in (self.local_operator.graph, self.local_operator.own)
                     if op is not None]
        return {"tensor_bytes": tensor_report(
            [self.setup.graph.x, self.local_x], [held_adjacency(self.setup.graph), operators],
            self.activations.peak, None, self.model, self.optimizer,
            more_buffer_bytes=2 * (parameters + 2) * 8)}


def build_fedgcn(setup: RankSetup) -> FedGCNMethod:
    return FedGCNMethod(setup)
