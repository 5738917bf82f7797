"""LLCG (Ramezani, Cong, Mahdavi, Kandemir, Sivasubramaniam, "Learn Locally, Correct Globally: A
Distributed Algorithm for Training Graph Neural Networks", ICLR 2022), as its reference code runs
it (MortezaRamezani/llcg, mode d2gnncor: ``dgnn/train/dist/distgnn_correction.py``).

One round per step, one step per epoch (``--steps-per-epoch`` 0 means 1, as FedAvg):

1. local: every client runs K_r neighbour-sampled Adam steps on its own induced subgraph
   (cross-client edges dropped, degrees counted there: FedAvg's local graph) with its own Adam
   state, kept across rounds. A step draws ``--batch-size`` node ids uniformly with replacement
   (``--llcg-seeds all``: over every node of the graph, as the reference; ``train``: over its
   training nodes), samples up to ``--fanouts[h]`` neighbours per hop with GraphSAGE's sampler
   (``mpifgl.methods.sampled.NeighbourSampler``) and takes the mean cross-entropy over the drawn
   training nodes, each as often as it was drawn;
2. average: one Reduce to the server of [n_i w_i, n_i m_i, n_i v_i, n_i t_i, n_i loss_i, n_i]
   (FedAvg's weighted sum, ``fedavg_contribution``; n_i = the client's training nodes; m, v, t =
   its Adam moments and step count, sent unless ``--llcg-no-sync-moments``: the reference's
   server_opt_sync); the server takes the weighted means;
3. correction: the server, which holds the whole graph, runs S = ``--llcg-server-steps`` steps of
   the same kind on the GLOBAL graph with its own Adam (lr ``--llcg-server-lr``), which starts
   each round from the averaged moments (or, with ``--llcg-no-sync-moments``, keeps its own);
4. broadcast: the corrected model goes back to every client (one Scatterv, a copy per client),
   which continues from it with its own moments (the reference sends back the model only).

K_r = ceil(K / rho^r) for round r = 0, 1, ... (``--llcg-rho``; at least 1 step), or reversed with
``--llcg-grow-k``: ceil(K / rho^(E-1-r)), growing to K in the last of the E rounds (the
reference's inc_k; E = --epochs x --steps-per-epoch).

A sampled step uses the project's GNN (``--backbone``, the model FedAvg and centralized train),
with each node's aggregation over its sampled neighbours standing for all of them: the
backbone's scales on the graph's degrees (``GraphLayer.scales``), a node's neighbour sum times
d_v / c_v (c_v of its d_v neighbours sampled). For GraphSAGE-mean that is the mean over the
sampled neighbours (the reference's row-normalised aggregation); with fan-outs above every
degree a step is the full-neighbourhood step of the seeds (tests/unit/mpifgl/methods/
test_llcg.py). The sample's layers are not trimmed: every layer computes every sampled node,
the seeds' outputs are those of the trimmed stack.

Evaluation and ``--save-logits``: the server predicts every node with the global model on the
whole graph (the reference's full-neighbour inference at the server); clients predict nothing.

Departures from the reference (docs/algorithms.md lists them with the settings):

* the layer is ``--backbone``'s (GCN by default, symmetric normalisation), not the reference's
  GConv, a row-normalised mean with self loop, (D+I)^-1 (A+I) H W; ``--backbone sage`` is the
  nearest to its Reddit layer (SAGEConv, whose mean there includes the node itself);
* a node drawn twice is sampled once and weighs twice in the loss (the reference samples each
  copy's neighbours apart); a step that draws no training node is skipped (the reference's loss
  would be NaN);
* the server's Adam step count after the moments' average is their weighted mean, rounded;
* the moments travel up with the model and are counted in the bytes (the reference counts
  the model only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mpifgl.graph import ClientGraph, build_operator
from mpifgl.methods.fedavg import fedavg_contribution, fedavg_result, local_graph
from mpifgl.methods.sampled import NeighbourSample, NeighbourSampler
from mpifgl.model import (GNN, Features, LayerOperator, flatten, layer_type, make_features,
                          select_rows, unflatten)
from mpifgl.operators import SparseOperator
from mpifgl.optim import Adam
from mpifgl.trainer import PhaseMeter, RankSetup

PHASES = ("local", "average", "correction", "broadcast")


def local_steps_of_round(steps: int, rho: float, round_index: int, rounds: int,
                         grow: bool = False) -> int:
    """K_r = ceil(K / rho^r), the reference's schedule (r from 0); ``grow``: the list reversed
    over ``rounds`` (its inc_k). At least one step where K / rho^r rounds below it."""
    exponent = rounds - 1 - round_index if grow else round_index
    with np.errstate(over="ignore"):  # rho^r past float range: K / inf = 0, then one step
        return max(1, int(np.ceil(steps / np.power(rho, max(0, exponent)))))


def draw_seeds(pool: np.ndarray, draws: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` ids drawn uniformly with replacement from ``pool``: (distinct ids ascending,
    how often each was drawn)."""
    return np.unique(pool[rng.integers(0, pool.shape[0], size=draws)], return_counts=True)


def sampled_operator(sample: NeighbourSample, degree: np.ndarray, backbone: str,
                     dtype: torch.dtype, device: torch.device | str = "cpu") -> LayerOperator:
    """The operator of every layer on one neighbour sample (its nodes in sample order):
    A's sampled entries, the backbone's scales on the graph's ``degree`` (no self loop), and
    each row's neighbour sum times d_v / c_v, its c_v sampled neighbours standing for all d_v
    of them (0 for the last hop's nodes, which sample none: no seed's output uses theirs)."""
    k = sample.nodes.shape[0]
    source, target = sample.edge_index
    adjacency = sp.csr_matrix((np.ones(source.shape[0]), (target, source)), shape=(k, k))
    adjacency.sort_indices()
    sampled = np.diff(adjacency.indptr)
    full = degree[sample.nodes].astype(np.float64)
    scales = layer_type(backbone).scales(torch.from_numpy(full), torch.ones(k, dtype=torch.float64))
    stands_for = np.divide(full, sampled, out=np.zeros(k), where=sampled > 0)
    as_col = lambda v: v.to(device=device, dtype=dtype)[:, None]  # noqa: E731
    return LayerOperator(torch.from_numpy(sample.nodes).to(device),
                         SparseOperator(adjacency, dtype, device),
                         as_col(scales.row * torch.from_numpy(stands_for)), as_col(scales.col),
                         as_col(scales.self))


@dataclass
class SampledBatch:
    """One step's sample: the seeds come first in ``sample.nodes``; ``weight`` [seeds] = how
    often each seed was drawn if it is a training node, else 0."""

    sample: NeighbourSample
    operator: LayerOperator
    weight: np.ndarray


class NeighbourSteps:
    """LLCG's step on one graph (a client's local graph, or the server's whole graph): draw a
    batch, sample its neighbourhood, one optimizer step of the GNN on it."""

    def __init__(self, graph: ClientGraph, features: Features, labels: torch.Tensor,
                 setup: RankSetup, batch_size: int):
        config = setup.config
        self.setup, self.features, self.labels = setup, features, labels
        self.backbone, self.batch_size = config.backbone, batch_size
        self.degree, self.train_mask = graph.degree, np.asarray(graph.train_mask, dtype=bool)
        self.pool = (np.arange(graph.num_nodes, dtype=np.int64) if config.llcg_seeds == "all"
                     else np.flatnonzero(self.train_mask).astype(np.int64))
        self.sampler = NeighbourSampler(graph.inner.tocsr(), list(config.fanouts),
                                        setup.sample_rng)

    def draw(self) -> SampledBatch | None:
        """A batch and its neighbour sample; None when the draws hold no training node."""
        if self.pool.shape[0] == 0:
            return None
        seeds, counts = draw_seeds(self.pool, self.batch_size, self.setup.sample_rng)
        weight = counts * self.train_mask[seeds]
        if not weight.any():
            return None
        sample = self.sampler.sample(seeds)
        return SampledBatch(sample, sampled_operator(sample, self.degree, self.backbone,
                                                     self.setup.dtype, self.setup.device),
                            weight.astype(np.float64))

    def step(self, model: GNN, optimizer: Adam, batch: SampledBatch) -> float:
        """One optimizer step; the loss = the drawn training nodes' mean cross-entropy."""
        device = self.setup.device
        model.train()
        optimizer.zero_grad()
        logits = model(select_rows(self.features, batch.operator.rows), batch.operator,
                       self.setup.dropout_rng)
        used = np.flatnonzero(batch.weight)
        rows = torch.from_numpy(used).to(device)
        seeds = torch.from_numpy(batch.sample.nodes[used]).to(device)
        weight = torch.from_numpy(batch.weight[used] / batch.weight.sum()).to(device, logits.dtype)
        loss = (F.cross_entropy(logits[rows], self.labels[seeds], reduction="none") * weight).sum()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def run(self, model: GNN, optimizer: Adam, steps: int) -> float:
        """``steps`` draws, a step on each that holds a training node; their mean loss."""
        losses = [self.step(model, optimizer, batch)
                  for batch in (self.draw() for _ in range(steps)) if batch is not None]
        return float(np.mean(losses)) if losses else 0.0


def moments(optimizer: Adam) -> torch.Tensor:
    """Adam's state as one flat vector: first moments, second moments, step count."""
    return torch.cat([flatten(optimizer.exp_avg, torch.float64),
                      flatten(optimizer.exp_avg_sq, torch.float64),
                      torch.tensor([float(optimizer.step_count)], dtype=torch.float64)])


def load_moments(optimizer: Adam, flat: torch.Tensor) -> None:
    """The inverse of ``moments``; the step count rounded (a weighted mean of counts)."""
    size = sum(t.numel() for t in optimizer.exp_avg)
    with torch.no_grad():
        for mine, value in zip(optimizer.exp_avg, unflatten(flat[:size], optimizer.exp_avg)):
            mine.copy_(value)
        for mine, value in zip(optimizer.exp_avg_sq,
                               unflatten(flat[size:2 * size], optimizer.exp_avg_sq)):
            mine.copy_(value)
    optimizer.step_count = int(round(float(flat[2 * size])))


class LLCGMethod:
    """One rank's side of LLCG: a client's local graph, model and own Adam; or the server's
    whole graph, the global model and the correction's Adam."""

    def __init__(self, setup: RankSetup):
        config, comm = setup.config, setup.comm
        if setup.global_split_counts["train"] == 0:
            raise ValueError(f"--algo {config.algo} needs training nodes: the shards have none")
        if comm.is_server and setup.whole_graph is None:
            raise ValueError(f"--algo {config.algo}: the server holds no graph (the registry's "
                             "server_loads_graph must be set)")
        self.setup, self.comm = setup, comm
        self.config = config if config.steps_per_epoch else config.replace(steps_per_epoch=1)
        self.rounds = self.config.epochs * self.config.steps_per_epoch
        self.round = 0  # rounds done: the rho schedule's r (kept in checkpoints)
        self.phases = PhaseMeter(comm, PHASES)
        self.model, client_optimizer = setup.gnn_and_optimizer()
        self.parameters = list(self.model.parameters())
        dtype, device = setup.dtype, setup.device
        if comm.is_server:
            whole = setup.whole_graph
            self.optimizer = Adam(self.parameters, lr=config.llcg_server_lr,
                                  weight_decay=config.weight_decay)
            self.x = make_features(whole.x, dtype, config.feature_format, device=device)
            self.y = torch.from_numpy(np.asarray(whole.y, dtype=np.int64)).to(device)
            self.steps = NeighbourSteps(whole, self.x, self.y, setup,
                                        config.llcg_server_batch_size or config.batch_size)
            self.full_operator = build_operator(whole, config.backbone, None, None, dtype,
                                                False, device)
            self.evaluated_nodes = (self.y, {"train": whole.train_mask, "val": whole.val_mask,
                                             "test": whole.test_mask}, whole.global_id)
            self.weight = 0.0
        else:
            local = local_graph(setup.graph).graph  # cross-client edges dropped, local degrees
            self.optimizer = client_optimizer
            self.x = make_features(local.x, dtype, config.feature_format, device=device)
            self.steps = NeighbourSteps(local, self.x, setup.y, setup, config.batch_size)
            nothing = np.zeros(0, dtype=bool)
            self.evaluated_nodes = (setup.y[:0], dict.fromkeys(("train", "val", "test"), nothing),
                                    np.zeros(0, dtype=np.int64))
            self.weight = float(local.train_mask.sum())  # n_i: local training nodes

    # -- one round ----------------------------------------------------------------------------
    def train_step(self) -> float:
        """One round: local steps, the weighted average at the server, its correction, the
        model back to every client. Returns the weighted mean of the clients' local losses."""
        config = self.config
        loss = 0.0
        with self.phases("local"):
            if self.comm.is_client and self.weight > 0:
                steps = local_steps_of_round(config.llcg_local_steps, config.llcg_rho,
                                             self.round, self.rounds, config.llcg_grow_k)
                loss = self.steps.run(self.model, self.optimizer, steps)
        trained = flatten(self.parameters).cpu()
        # mpifgl.finite: this rank's own loss and parameters, checked before the sum mixes them
        self.setup.finite.before_sum(loss, trained, self.model, "parameter after local training")
        shared = torch.cat([trained.to(torch.float64), moments(self.optimizer).cpu()]) \
            if config.llcg_sync_moments else trained
        with self.phases("average"):
            summed = self.comm.sum_to_server(fedavg_contribution(shared, self.weight, loss))
        if self.comm.is_server:
            average, loss = fedavg_result(summed)
            self._load_parameters(average[:trained.shape[0]])
            if config.llcg_sync_moments:
                load_moments(self.optimizer, average[trained.shape[0]:])
            with self.phases("correction"):
                self.steps.run(self.model, self.optimizer, config.llcg_server_steps)
        with self.phases("broadcast"):
            loss = self._broadcast(loss)
        self.round += 1
        return loss

    def _load_parameters(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, value in zip(self.parameters, unflatten(flat.to(self.setup.device),
                                                           self.parameters)):
                p.copy_(value)

    def _broadcast(self, loss: float) -> float:
        """The server's model and the round's loss to every client (a Scatterv of one copy per
        client: what a star broadcast moves); every rank returns the loss."""
        size = sum(p.numel() for p in self.parameters) + 1
        send, counts = None, None
        if self.comm.is_server:
            message = torch.cat([flatten(self.parameters, torch.float64).cpu(),
                                 torch.tensor([loss], dtype=torch.float64)])
            send = message.repeat(self.comm.num_clients)
            counts = np.asarray([0] + [size] * self.comm.num_clients, dtype=np.int64)
        received = self.comm.scatterv(send, counts, size if self.comm.is_client else 0,
                                      torch.float64)
        if self.comm.is_server:
            return loss
        self._load_parameters(received[:-1])
        return float(received[-1])

    # -- evaluation: the server predicts every node on the whole graph ------------------------
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        if not self.comm.is_server:
            return torch.zeros((0, self.setup.num_classes), dtype=self.setup.dtype,
                               device=self.setup.device)
        self.model.eval()
        return self.model(self.x, self.full_operator)

    # -- checkpoints: every client's Adam state is its own; the round counts the schedule ----
    def rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"round": self.round}
        if self.comm.is_client:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def restore_rank_state(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])


def build_llcg(setup: RankSetup) -> LLCGMethod:
    return LLCGMethod(setup)
