"""FedSage+ (Zhang, Yang, Liu, Yu, Lv, Zhao, Xue, "Subgraph Federated Learning with Missing
Neighbor Generation", NeurIPS 2021; reference code zkhku/fedsage, src/fedsage_plus.py and
src/train_locSagePlus.py), as ``--algo fedsage-plus``.

At set-up, on every client (NeighGen's model: ``mpifgl.methods.neighgen``):

1. the impaired graph G_i^-: ``--neighgen-hidden-portion`` of the nodes ``--neighgen-hide-from``
   allows are hidden with their edges; each kept node's targets are its count of hidden
   neighbours and the features of up to K of them;
2. local NeighGen training: ``--neighgen-epochs`` full-batch Adam steps of encoder, dGen, fGen and
   classifier on SmoothL1(count) + greedy loss + cross-entropy on the mended G_i^- (weights
   ``--neighgen-{count,feature,class}-weight``), all on the training nodes;
3. federated fGen training: ``--neighgen-fed-epochs`` more steps of fGen only (a fresh Adam; the
   encoder, dGen and classifier frozen in evaluation mode, as the reference leaves them); client
   i's loss adds, for every other client j, a greedy term of its generated rows against K
   neighbours of a random node of j, the whole divided by the number of clients M. Here the rows
   go to j through the server (``exchange_generated_rows``), j scores them against its own
   features and returns the gradient with respect to each row (and its least MSE) through the
   server, summed over j; i back-propagates it into fGen. Raw features are never sent (what the
   answers reveal about the drawn neighbours: docs/privacy.md);
4. mending: NeighGen (evaluation mode, fGen's noise kept) runs on G_i^- and each kept node v gets
   min(K, floor(n^_v)) generated nodes attached in the FULL local graph G_i, as the reference's
   ``fill_graph`` does (hidden nodes get none); they are unlabelled, never in the loss or the
   evaluation.

Then the classifier is the project's FedAvg (``mpifgl.methods.fedavg``: its local-graph builder,
backbone, optimizer and evaluation) on the mended graphs, the clients' models averaged equally
(``--client-weights uniform``, the reference's mean).

Departures from the reference (each also in docs/algorithms.md):

* the greedy loss takes the least MSE over the true neighbours (``mpifgl.methods.neighgen``);
* the other clients' terms travel as generated rows and row gradients, not raw features; every
  client takes its step at once each epoch (the reference steps them in turn, which changes
  nothing: a client's loss depends on its own fGen only) and each draws its own random targets;
* mending runs fGen in evaluation mode (no dropout); the reference's FedSage+ mends with fGen
  still in training mode;
* the classifier is the project's full-batch backbone (``--backbone``, ``--hidden``, ``--lr``,
  ``--epochs``), evaluated on each client's own mended graph, as fedavg is, for comparability;
  the reference trains GraphSAGE-mean [64, 32] on mini-batches of 32 with fan-outs [5, 5], 20
  rounds of one local epoch at lr 1e-3, and evaluates it on the whole global graph;
* hidden nodes: the reference's clients split their nodes 60/20/20 and hide half of the nodes in
  neither train nor test; here the shards' split decides (``--neighgen-hide-from``), and NeighGen
  and the classifier train on the same training nodes (the reference draws a second, 50/20
  split for its classifier);
* a client without training nodes trains no NeighGen and mends nothing (the reference has none);
  a client without an edge has no neighbour to offer and adds nothing to the others' terms (the
  reference would draw forever).

A resumed run builds the same mended graphs again (every draw is seeded by --seed and the rank),
then restores the classifier and its optimizers from the checkpoint.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mpifgl.communicator import Communicator, client_of_rank, rank_of_client
from mpifgl.methods.fedavg import FedAvgMethod, local_graph
from mpifgl.methods.neighgen import (NeighGen, NeighGenShape, answer_rows, binary_adjacency,
                                     greedy_loss, hide_candidates, impair, mended_operator,
                                     row_normalised, slot_counts, slot_rows)
from mpifgl.operators import SparseOperator
from mpifgl.optim import Adam
from mpifgl.trainer import RankSetup

log = logging.getLogger("mpifgl")

# NeighGen's own random streams, apart from the classifier's (weights, draws, dropout and noise)
WEIGHT_STREAM, DRAW_STREAM, DROPOUT_STREAM = 101, 102, 103


def stream_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, np.uint64)[0] >> 1)


# -- the route of the generated rows -------------------------------------------------------------

Answer = Callable[[torch.Tensor, np.ndarray], torch.Tensor]


def exchange_generated_rows(comm: Communicator, rows: torch.Tensor, groups: np.ndarray,
                            answer: Answer | None) -> torch.Tensor:
    """Collective on every rank. Each client's generated rows [R_i, F] (node-major slot rows of
    G_i nodes, ``groups`` [G_i, 2] = each node's slots and min(K, n_v)) go through the server to
    every other client, which ``answer``s them ([R, F] and [G, 2] -> [R, F + 1]); the server sums
    the answers for each sender and returns them: [R_i, F + 1] on a client, [0, F + 1] on the
    server. M - 1 rounds: in round s client c answers client (c - s) mod M, so the server holds
    one copy of the rows, not M - 1."""
    width = rows.shape[1]
    dtype = rows.dtype
    sizes = comm.gather_equal(torch.tensor([rows.shape[0], groups.shape[0]], dtype=torch.int64))
    table = comm.broadcast_array(sizes.reshape(-1) if comm.is_server else None).view(-1, 2)
    row_count, group_count = table[:, 0].numpy(), table[:, 1].numpy()
    m = comm.num_clients
    clients = range(1, comm.size)
    all_rows = comm.gatherv(rows.contiguous().reshape(-1),
                            row_count * width if comm.is_server else None)
    all_groups = comm.gatherv(torch.from_numpy(np.ascontiguousarray(groups, np.int64)).reshape(-1),
                              group_count * 2 if comm.is_server else None)
    if comm.is_server:
        row_pieces = torch.split(all_rows, (row_count * width).tolist())
        group_pieces = torch.split(all_groups, (group_count * 2).tolist())
        totals = [torch.zeros(int(row_count[r]) * (width + 1), dtype=dtype) for r in range(comm.size)]
    for shift in range(1, m):
        sender = np.zeros(comm.size, dtype=np.int64)
        for r in clients:
            sender[r] = rank_of_client((client_of_rank(r) - shift) % m)
        counts = np.where(np.arange(comm.size) > 0, row_count[sender], 0)
        mine = int(counts[comm.rank])
        incoming = comm.scatterv(
            torch.cat([row_pieces[s] for s in sender[1:]]) if comm.is_server else None,
            counts * width if comm.is_server else None, mine * width, dtype)
        group_counts = np.where(np.arange(comm.size) > 0, group_count[sender], 0)
        incoming_groups = comm.scatterv(
            torch.cat([group_pieces[s] for s in sender[1:]]) if comm.is_server else None,
            group_counts * 2 if comm.is_server else None, int(group_counts[comm.rank]) * 2,
            torch.int64)
        reply = (answer(incoming.view(mine, width), incoming_groups.view(-1, 2).numpy())
                 if comm.is_client and answer is not None
                 else torch.zeros((mine, width + 1), dtype=dtype))
        replies = comm.gatherv(reply.to(dtype).contiguous().reshape(-1),
                               counts * (width + 1) if comm.is_server else None)
        if comm.is_server:
            for r, piece in zip(clients, torch.split(replies, (counts[1:] * (width + 1)).tolist())):
                totals[sender[r]] += piece
    result = comm.scatterv(torch.cat(totals) if comm.is_server else None,
                           row_count * (width + 1) if comm.is_server else None,
                           int(row_count[comm.rank]) * (width + 1), dtype)
    return result.view(-1, width + 1)


# -- one client's NeighGen -----------------------------------------------------------------------


@dataclass
class Losses:
    """One NeighGen epoch's loss terms (``other``: the other clients' greedy terms, summed)."""

    count: float = 0.0
    feature: float = 0.0
    classify: float = 0.0
    other: float = 0.0


class NeighGenClient:
    """A client's impaired graph, NeighGen and its two training phases, and the mending."""

    def __init__(self, setup: RankSetup):
        config, graph = setup.config, setup.graph
        self.config, self.setup = config, setup
        self.device, self.dtype = setup.device, setup.dtype
        self.num_pred = config.neighgen_num_pred
        self.rounding = config.neighgen_count_rounding
        rank = setup.comm.rank
        self.draws = np.random.default_rng(stream_seed(config.seed, rank, DRAW_STREAM))
        self.rng = torch.Generator(device=self.device).manual_seed(
            stream_seed(config.seed, rank, DROPOUT_STREAM))
        self.full_adjacency = binary_adjacency(graph.inner)
        candidates = hide_candidates(graph.train_mask, graph.val_mask, graph.test_mask,
                                     config.neighgen_hide_from)
        self.impaired = impair(self.full_adjacency, graph.x, graph.train_mask, candidates,
                               config.neighgen_hidden_portion, self.num_pred, self.draws)
        on_device = lambda a: torch.from_numpy(np.asarray(a)).to(self.device)  # noqa: E731
        self.full_x = on_device(graph.x).to(self.dtype)
        self.x = self.full_x[on_device(self.impaired.kept)]
        self.operator = SparseOperator(row_normalised(self.impaired.adjacency), self.dtype,
                                       self.device)
        self.train = on_device(self.impaired.train)
        self.y = on_device(graph.y[self.impaired.kept]).to(torch.int64)
        self.missing_count = on_device(self.impaired.missing_count).to(torch.int64)
        self.true_count = self.missing_count.clamp(max=self.num_pred)
        self.targets = on_device(self.impaired.targets)
        self.missing_x = on_device(self.impaired.missing_x).to(self.dtype)
        shape = NeighGenShape(graph.x.shape[1], setup.num_classes, config.neighgen_hidden,
                              config.neighgen_latent, tuple(config.neighgen_generator_widths),
                              self.num_pred, config.neighgen_dropout)
        self.model = NeighGen(shape, stream_seed(config.weight_seed, rank, WEIGHT_STREAM),
                              self.dtype).to(self.device)
        self.weights = (config.neighgen_count_weight, config.neighgen_feature_weight,
                        config.neighgen_class_weight)

    @property
    def trains(self) -> bool:
        return int(self.train.shape[0]) > 0

    def _adam(self, parameters) -> Adam:
        return Adam(list(parameters), lr=self.config.neighgen_lr,
                    weight_decay=self.config.neighgen_weight_decay)

    def _own_terms(self, generated: torch.Tensor, predicted: torch.Tensor, slots: torch.Tensor,
                   mended: SparseOperator, rng: torch.Generator | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SmoothL1 of the count, greedy loss and cross-entropy, on the training nodes."""
        t = self.train
        count = F.smooth_l1_loss(predicted[t], self.missing_count[t].to(self.dtype))
        g = self.targets  # the training nodes with hidden neighbours: the others' terms are 0
        feature = greedy_loss(generated[g], self.missing_x, slots[g], self.true_count[g],
                              num_nodes=int(t.shape[0]))
        scores = self.model.classify(self.x, generated, mended, rng)
        classify = F.cross_entropy(scores[t], self.y[t])
        return count, feature, classify

    def train_locally(self) -> Losses:
        """Local NeighGen training: every part of the model, full batch."""
        losses = Losses()
        if not self.trains:
            return losses
        optimizer = self._adam(self.model.parameters())
        a, b, c = self.weights
        for _ in range(self.config.neighgen_epochs):
            self.model.train()
            optimizer.zero_grad()  # a fresh gradient, not one more buffer
            z, predicted = self.model.encode(self.x, self.operator, self.rng)
            generated = self.model.features(z, self.rng, self.config.neighgen_chunk_rows)
            slots = slot_counts(predicted, self.num_pred, self.rounding)
            mended = mended_operator(self.impaired.adjacency, slots, self.num_pred, self.dtype,
                                     self.device)
            count, feature, classify = self._own_terms(generated, predicted, slots, mended,
                                                       self.rng)
            (a * count + b * feature + c * classify).backward()
            optimizer.step()
            losses = Losses(count.item(), feature.item(), classify.item())
        return losses

    def start_federated(self) -> tuple[np.ndarray, np.ndarray]:
        """Freeze all but fGen (evaluation mode) and fix what no longer changes: z, n^, the slot
        counts and the mended operator. Returns the rows this client sends each epoch: (node,
        slot) of the counted slots of its training nodes that have hidden neighbours, and those
        nodes' (slots, min(K, n_v))."""
        model = self.model
        model.eval()
        model.features.train()
        for part in (model.encoder, model.count, model.classifier):
            part.requires_grad_(False)
        with torch.no_grad():
            self.z, self.predicted = model.encode(self.x, self.operator, None)
        self.slots = slot_counts(self.predicted, self.num_pred, self.rounding)
        self.mended = mended_operator(self.impaired.adjacency, self.slots, self.num_pred,
                                      self.dtype, self.device)
        self.generator_optimizer = self._adam(model.features.parameters())
        t = self.train
        sends = t[(self.slots[t] > 0) & (self.true_count[t] > 0)]
        groups = torch.stack([self.slots[sends], self.true_count[sends]], dim=1).cpu().numpy()
        node, slot = slot_rows(groups[:, 0])
        return np.stack([sends.cpu().numpy()[node], slot], axis=1), groups

    def generate(self) -> torch.Tensor:
        return self.model.features(self.z, self.rng, self.config.neighgen_chunk_rows)

    def sent_rows(self, generated: torch.Tensor, sent: np.ndarray) -> torch.Tensor:
        """[R, F]: the generated rows at ``sent``'s (node, slot) pairs."""
        return generated[torch.from_numpy(sent[:, 0]).to(self.device),
                         torch.from_numpy(sent[:, 1]).to(self.device)]

    def federated_step(self, generated: torch.Tensor, sent: np.ndarray, answers: torch.Tensor,
                       num_clients: int) -> Losses:
        """One fGen step: the own terms plus the other clients' answers ([R, F + 1]: each sent
        row's gradient of their summed least MSEs, and that MSE), all divided by M."""
        if not self.trains:
            return Losses()
        a, b, c = self.weights
        self.generator_optimizer.zero_grad()  # a fresh gradient, not one more buffer
        count, feature, classify = self._own_terms(generated, self.predicted, self.slots,
                                                   self.mended, None)
        scale = b / (self.num_pred * int(self.train.shape[0]))  # the reference's mean per term
        answers = answers.to(self.device, self.dtype)
        rows = self.sent_rows(generated, sent)
        surrogate = (a * count + b * feature + c * classify
                     + scale * (rows * answers[:, :-1]).sum()) / num_clients
        surrogate.backward()
        self.generator_optimizer.step()
        return Losses(count.item(), feature.item(), classify.item(),
                      float(answers[:, -1].sum()) / (self.num_pred * int(self.train.shape[0])))

    def answer(self, rows: torch.Tensor, groups: np.ndarray) -> torch.Tensor:
        """Another client's rows scored against this client's own features (full local graph)."""
        return answer_rows(rows, groups, self.full_adjacency, self.full_x, self.num_pred,
                           self.draws).cpu()

    @torch.no_grad()
    def mend(self) -> tuple[sp.csr_matrix, np.ndarray]:
        """(edges [n_i, k], features [k, F]) of the generated nodes attached in G_i: node v of
        G_i^- gets its first min(K, floor(n^_v)) generated rows."""
        graph = self.setup.graph
        model = self.model
        n = graph.num_nodes
        if not self.trains:
            return sp.csr_matrix((n, 0), dtype=np.float32), np.zeros((0, graph.x.shape[1]))
        model.eval()
        z, predicted = model.encode(self.x, self.operator, None)
        slots = slot_counts(predicted, self.num_pred, self.rounding)
        node, slot = slot_rows(slots.cpu().numpy())
        step = model.features.chunk_size(z.shape[0], self.config.neighgen_chunk_rows)
        pieces = []
        for start in range(0, z.shape[0], step):  # only the attached rows are kept
            generated = model.features(z[start:start + step], self.rng)
            chosen = (node >= start) & (node < start + step)
            pieces.append(generated[torch.from_numpy(node[chosen] - start).to(self.device),
                                    torch.from_numpy(slot[chosen]).to(self.device)].cpu())
        rows = torch.cat(pieces).numpy() if pieces else np.zeros((0, graph.x.shape[1]))
        parents = self.impaired.kept[node]
        k = parents.shape[0]
        edges = sp.csr_matrix((np.ones(k, np.float32), (parents, np.arange(k))), shape=(n, k))
        return edges, rows


# -- the method ----------------------------------------------------------------------------------


def _traffic(comm: Communicator) -> np.ndarray:
    return np.asarray([comm.bytes_sent, comm.bytes_received], dtype=np.float64)


class FedSagePlusMethod(FedAvgMethod):
    """One rank's FedSage+: NeighGen at set-up (collective: the federated fGen phase routes
    rows through the server), then FedAvg on the mended local graph. ``setup_summary`` (the
    server's, into final.json): per rank the bytes of the federated phase, per client the
    hidden and generated nodes, the rows and nodes it sends per federated epoch and NeighGen's
    last losses."""

    def __init__(self, setup: RankSetup):
        comm, config = setup.comm, setup.config
        if setup.global_split_counts["train"] == 0:
            raise ValueError(f"--algo {config.algo} needs training nodes: the shards have none")
        if comm.is_server:  # the set-up can take long: say what it does, then each fGen epoch
            log.info("FedSage+ set-up: NeighGen trains %d local epochs on every client, then %d "
                     "federated epochs of fGen", config.neighgen_epochs,
                     config.neighgen_fed_epochs)
        client = NeighGenClient(setup) if comm.is_client else None
        local = client.train_locally() if client else Losses()
        before = _traffic(comm)
        federated, sent = self._train_federated(setup, client)
        moved = _traffic(comm) - before
        mended = None
        generated = hidden = 0
        if client is not None:
            edges, features = client.mend()
            mended = local_graph(setup.graph, edges, features)
            generated, hidden = edges.shape[1], client.impaired.num_hidden
        super().__init__(setup, local=mended)
        self.setup_summary = self._summarise(comm, moved, [hidden, generated, *sent], local,
                                             federated)

    @staticmethod
    def _train_federated(setup: RankSetup, client: NeighGenClient | None
                         ) -> tuple[Losses, tuple[int, int]]:
        """Federated fGen training; every rank runs the same exchanges (none with one client).
        Returns the last epoch's losses and the (rows, nodes) this client sends every epoch."""
        comm, width = setup.comm, setup.graph.x.shape[1]  # the server's empty graph has F too
        losses = Losses()
        if setup.config.neighgen_fed_epochs == 0:
            return losses, (0, 0)
        sent, groups = (client.start_federated() if client else
                        (np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64)))
        start, epochs = time.perf_counter(), setup.config.neighgen_fed_epochs
        for epoch in range(epochs):
            generated = client.generate() if client else None
            rows = (client.sent_rows(generated, sent).detach().cpu() if client
                    else torch.zeros((0, width), dtype=setup.dtype))
            answers = (exchange_generated_rows(comm, rows, groups,
                                               client.answer if client else None)
                       if comm.num_clients > 1 else torch.zeros((rows.shape[0], width + 1)))
            if client:
                losses = client.federated_step(generated, sent, answers, comm.num_clients)
            if comm.is_server:  # its first exchange waits for every client's local epochs
                log.info("FedSage+ set-up: federated fGen epoch %d/%d exchanged, %.1f s after "
                         "the server's start of the phase", epoch + 1, epochs,
                         time.perf_counter() - start)
        return losses, (sent.shape[0], groups.shape[0])

    @staticmethod
    def _summarise(comm: Communicator, moved: np.ndarray, counts: list[int], local: Losses,
                   federated: Losses) -> dict[str, Any]:
        """``counts``: hidden nodes, generated nodes, rows and nodes sent per federated epoch."""
        row = np.concatenate([moved, counts, [local.count, local.feature, local.classify,
                                              federated.count, federated.feature,
                                              federated.classify, federated.other]])
        table = comm.gather_rows(torch.from_numpy(row))
        if table is None:
            return {}
        table = table.numpy()
        clients = table[1:]
        summary = {
            "setup_bytes": {"neighgen_federated": {
                "bytes_sent": [int(v) for v in table[:, 0]],
                "bytes_received": [int(v) for v in table[:, 1]]}},
            "fedsage": {"hidden_nodes": [int(v) for v in clients[:, 2]],
                        "generated_nodes": [int(v) for v in clients[:, 3]],
                        "rows_sent_per_epoch": [int(v) for v in clients[:, 4]],
                        "nodes_sent_per_epoch": [int(v) for v in clients[:, 5]],
                        # count, feature, class (and the other clients' feature terms)
                        "neighgen_local_losses": clients[:, 6:9].tolist(),
                        "neighgen_federated_losses": clients[:, 9:13].tolist()}}
        log.info("FedSage+ set-up: %d nodes hidden, %d generated; NeighGen local loss (count, "
                 "feature, class) %s, federated %s; federated fGen moved %.2f MiB",
                 int(clients[:, 2].sum()), int(clients[:, 3].sum()),
                 np.round(clients[:, 6:9].mean(axis=0), 4).tolist(),
                 np.round(clients[:, 9:13].mean(axis=0), 4).tolist(),
                 (table[:, 0].sum() + table[:, 1].sum()) / 2 / 2 ** 20)
        return summary
