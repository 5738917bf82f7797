"""``ours`` and ``centralized``: the paper's GNN over every client's nodes, its cross-client terms
exchanged through the server each layer (in one process: the whole graph, nothing exchanged).
``bns`` is the same method with another sampler (``mpifgl.methods.bns``).

Phases of one step: sample -> forward (one cross-client exchange per layer) -> loss ->
backward (the same exchange per layer, with gradients) -> gradient sum -> optimizer step.

Loss weighting: the loss is the sum of cross-entropies over the training nodes in the step's
rows (all nodes, or the sample), divided by the GLOBAL number of such nodes. Without sampling this
is exactly the centralized mean cross-entropy, so gradients match centralized training.

The server of an MPI world holds no nodes: it takes part in every collective and computes only
the sums.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from mpifgl.config import TrainConfig
from mpifgl.exchange import WIRE_TYPES, CrossClientSums, build_exchange
from mpifgl.graph import build_operator
from mpifgl.model import (Features, LayerOperator, flatten, gradients, make_features, select_rows,
                          unflatten)
from mpifgl.operators import SparseFeatures
from mpifgl.sampling import (NodeSample, NodeSampler, client_sample_sizes, default_sample_size,
                             make_distribution, one_step_exact_first, steps_for_sample)
from mpifgl.tensor_memory import SavedActivations, held_adjacency, nbytes, tensor_report
from mpifgl.hardware import release_free_heap
from mpifgl.trainer import RankSetup, on_host

# From a step of this many rows on, the heap blocks its operator's construction freed are given
# back before the forward, where they would stay resident through the step's peak; a small
# step frees too little to pay for the call (docs/hardware.md)
RELEASE_HEAP_MIN_ROWS = 100_000


class StepSampler(Protocol):
    """Which of its nodes each client keeps for one step (the server keeps none)."""

    capacity: int  # the most nodes any client's sample can hold, the same on every rank
    steps_per_epoch: int  # what --steps-per-epoch 0 means with this sampler

    def resolved(self, config: TrainConfig) -> TrainConfig:
        """``config`` with the values this sampler settled (recorded in config.json)."""
        ...

    def sample(self) -> NodeSample | None:
        """This step's sample of this rank's nodes; None on the server."""
        ...


class LabelGuidedSampler:
    """``--sampling label|uniform``: s_i draws per client from the sampling distribution Q
    (label-guided: by the global counts of each group; see mpifgl/sampling.py)."""

    def __init__(self, setup: RankSetup):
        config, graph = setup.config, setup.graph
        n = int(graph.client_sizes.sum())
        self.total_draws = config.sample_size or default_sample_size(n, config.backbone)
        # the large-graph default of GCN and 1-GNN: one step of n draws with the first layer
        # exact, which keeps that step's cost near four steps of n/4 (docs/paper_scale.md, 5)
        self.exact_first_layer = config.exact_first_layer or (
            config.sample_size == 0 and one_step_exact_first(n, config.backbone))
        self.draws_per_client = client_sample_sizes(graph.client_sizes, self.total_draws)  # s_i
        self.node_sampler: NodeSampler | None = None
        if setup.comm.is_client:
            distribution = make_distribution(config.sampling, setup.groups,
                                             setup.global_group_counts)
            self.node_sampler = NodeSampler(distribution,
                                            int(self.draws_per_client[graph.client_id]),
                                            setup.sample_rng, normalize=not config.no_normalize)
        # s_i draws give at most s_i distinct nodes
        self.capacity = int(self.draws_per_client.max())
        # ceil(n / s - 1e-6) steps draw about n nodes: one pass over the graph, as any
        # mini-batch trainer; why not fewer, larger samples: docs/training.md (steps per epoch)
        self.steps_per_epoch = steps_for_sample(n, int(self.draws_per_client.sum()))

    def resolved(self, config: TrainConfig) -> TrainConfig:
        return config.replace(sample_size=self.total_draws,
                              exact_first_layer=self.exact_first_layer)

    def sample(self) -> NodeSample | None:
        return self.node_sampler.sample() if self.node_sampler is not None else None


class GNNMethod:
    """One rank's side of the distributed GNN (``ours``), or the whole of it in one process
    (``centralized``). ``sampler`` None: every step is a full-graph step."""

    def __init__(self, setup: RankSetup, sampler: StepSampler | None):
        config, comm, graph = setup.config, setup.comm, setup.graph
        self.setup, self.comm, self.graph, self.sampler = setup, comm, graph, sampler
        self.dtype, self.device = setup.dtype, setup.device
        self.x = make_features(graph.x, self.dtype, config.feature_format, device=self.device)
        self.train_mask = setup.mask("train")
        self.model, self.optimizer = setup.gnn_and_optimizer()
        self.exchanged = not comm.is_single_process  # cross-client terms go through the server
        self.cross_sums = None
        if sampler is not None:
            config = sampler.resolved(config)
        if config.history_every:  # layer 1's history is its input: exact, computed once
            config = config.replace(exact_first_layer=True)
        # --exact-first-layer: the first layer takes its input's aggregate, computed once
        first = 1 if config.exact_first_layer else 0
        if self.exchanged:
            widths = [layer.out_dim for layer in self.model.layers] + \
                ([graph.x.shape[1]] if first else [])
            self.cross_sums = CrossClientSums(build_exchange(
                comm, config.exchange, int(config.exchange_buffer_mb * 2 ** 20), max(widths),
                self.dtype, setup.masking, WIRE_TYPES.get(config.wire_dtype)))
            self.cross_sums.attach(self.model, first)
        if config.steps_per_epoch == 0:
            config = config.replace(steps_per_epoch=sampler.steps_per_epoch if sampler else 1)
        self.config = config
        self.full_operator = self.prepared(build_operator(graph, config.backbone, None, None,
                                                         self.dtype, self.exchanged, self.device))
        if self.exchanged:  # every later plan is selected from the transposed block
            graph.release_cross_block()
        self.input_aggregate = None
        if config.exact_first_layer:
            self.input_aggregate = self.aggregate_input()
            self.full_operator.input_aggregate = self.input_aggregate
            # GCN's first layer is one transform of (aggregate + self term): with that sum made
            # once, a rank keeps it instead of both it and the features (a step's sample scales
            # its self term as the full graph does, unless it is normalised as its own graph)
            if not config.subgraph_norm and self.model.layers[0].fold_self_term(
                    self.input_aggregate, self.x, self.full_operator):
                self.full_operator.input_has_self = True
                self.x = None
                graph.release_features()
        # --history-every: per layer above the first, (its full-graph input, that input's
        # exact aggregate) at the last refresh; refreshed every history_period steps
        self.history: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.history_period = config.history_every * config.steps_per_epoch
        self.steps_taken = 0
        # what rank_report says: autograd's saved tensors, and the largest step's operator
        self.activations = SavedActivations([*self.model.parameters(),
                                             *([self.x] if isinstance(self.x, torch.Tensor)
                                               else [])])
        self.largest_step: tuple[int, int] = (0, 0)  # (operator bytes, exchange buffer bytes)

    @torch.no_grad()
    def full_aggregate(self, z: torch.Tensor, purpose: str = "setup",
                       index: int = 0) -> torch.Tensor:
        """row_scale * (A (col_scale * z)) over every neighbour, p = 1: the propagation of a
        layer's input, which holds no weight (collective: one full-graph exchange, masked with
        --secure, in the slot (purpose, index))."""
        op = self.full_operator
        y = z * op.col_scale
        total = op.inner @ y
        if self.cross_sums is not None:
            self.cross_sums.once(op.exchange, y, total, purpose, index)
        return total.mul_(op.row_scale)

    def aggregate_input(self) -> torch.Tensor:
        """The first layer's propagation of its input features (--exact-first-layer)."""
        return self.full_aggregate(self.x.dense() if isinstance(self.x, SparseFeatures)
                                   else self.x)

    @torch.no_grad()
    def refresh_history(self) -> None:
        """Every hidden layer's full-graph input (the model without dropout, the first layer
        exact) and its full aggregate (collective: one exchange per hidden layer). The server,
        which has no rows, runs the same exchanges."""
        op, layers = self.full_operator, list(self.model.layers)
        z = (layers[0].forward_folded(self.input_aggregate) if op.input_has_self else
             layers[0].forward_aggregated(self.x, self.input_aggregate, op)).relu_()
        history = []
        for k in range(1, len(layers)):
            history.append((z, self.full_aggregate(z, "history", k)))
            if k < len(layers) - 1:
                z = layers[k].forward_aggregated(z, history[-1][1], op).relu_()
        self.history = history

    def prepared(self, operator: LayerOperator) -> LayerOperator:
        """Agree on the operator's exchange chunks with the other ranks (collective: the compact
        exchanges send their row ids to the server here, once per operator)."""
        if self.cross_sums is not None:
            self.cross_sums.prepare(operator.exchange)
        return operator

    def start_pass(self, purpose: str) -> None:
        """A training step's exchanges and an evaluation's are separate slots (--secure keeps a
        range per slot)."""
        if self.cross_sums is not None:
            self.cross_sums.start_pass(purpose)

    # -- one step -------------------------------------------------------------------------------
    def train_step(self) -> float:
        if self.history_period and self.steps_taken % self.history_period == 0:
            self.refresh_history()
        self.steps_taken += 1
        operator, global_train_rows = self.sample_operator()
        loss = self.loss_and_gradients(operator, global_train_rows)
        self.optimizer.step()
        return loss

    def sample_operator(self) -> tuple[LayerOperator, int]:
        """Phase 'sample': this step's operator and the global count of training rows in it."""
        if self.sampler is None:
            return self.full_operator, self.setup.global_split_counts["train"]
        return self.operator_for_sample(self.sampler.sample())

    def sample_capacity(self) -> int:
        """The most nodes any client's sample can hold, the same on every rank."""
        if self.sampler is not None:
            return self.sampler.capacity
        return int(self.graph.client_sizes.max())

    def operator_for_sample(self, sample: NodeSample | None) -> tuple[LayerOperator, int]:
        """Share every client's sample (sorted local index + p(u); None on the server) and build
        this rank's operator for their union, with the global count of training rows in it.
        Collective: every rank calls it once per step. Any sampler can feed it (e.g. BNS-GCN)."""
        index = sample.index if sample is not None else np.zeros(0, dtype=np.int64)
        probability = sample.probability if sample is not None else np.zeros(0)
        train_rows = int(self.graph.train_mask[index].sum())
        # One Allgather of fixed-length rows [size, train rows, index, padding]: far cheaper
        # than an Allgatherv of the indices (docs/training.md)
        capacity = self.sample_capacity()
        if index.shape[0] > capacity:
            raise ValueError(f"a sample of {index.shape[0]} nodes on client "
                             f"{self.graph.client_id}, expected at most {capacity}")
        packed = np.full(2 + capacity, -1, dtype=np.int64)
        packed[:2] = index.shape[0], train_rows
        packed[2:2 + index.shape[0]] = index
        table = self.comm.allgather_rows(torch.from_numpy(packed)).numpy()
        global_train_rows = int(table[:, 1].sum())
        # copies: the operator keeps this client's sample, a view would keep all m + 1 rows
        by_rank = [row[2:2 + row[0]].copy() for row in table]
        del table
        samples = by_rank if self.comm.is_single_process else by_rank[1:]  # the server's is empty
        operator = self.prepared(build_operator(self.graph, self.config.backbone, samples,
                                                probability, self.dtype, self.exchanged,
                                                self.device, self.config.subgraph_norm))
        if self.input_aggregate is not None:
            operator.input_aggregate = torch.index_select(self.input_aggregate, 0, operator.rows)
            operator.input_has_self = self.full_operator.input_has_self
        if self.history is not None:
            operator.history = [(torch.index_select(past, 0, operator.rows),
                                 torch.index_select(aggregate, 0, operator.rows))
                                for past, aggregate in self.history]
        return operator, global_train_rows

    def input_rows(self, operator: LayerOperator) -> Features | None:
        """The features of ``operator``'s rows: a copy for a sample, the features themselves
        for the full graph, None where the input aggregate holds the self term."""
        if self.x is None or operator is self.full_operator:
            return self.x
        return select_rows(self.x, operator.rows)

    def loss_and_gradients(self, operator: LayerOperator, global_train_rows: int) -> float:
        """Phases forward, loss, backward, gradient sum: leaves the GLOBAL gradient in every
        parameter's .grad on every rank and returns the global loss."""
        self.start_pass("train")
        if not self.comm.is_client:  # the server runs no model: its side of the sums only
            self.cross_sums.server_pass(operator.exchange, backward=True)
            return self._sum_gradients_and_loss(
                [torch.zeros_like(p) for p in self.model.parameters()], 0.0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        # The full-graph operator's rows are all nodes in order: no copy of the features. A
        # sample's rows are copied for this step alone, so dropout masks them in place.
        sampled = operator is not self.full_operator
        large = sampled and operator.rows.shape[0] >= RELEASE_HEAP_MIN_ROWS
        if large:
            release_free_heap()  # the operator's temporaries: not resident through the peak
        x = self.input_rows(operator)
        with self.activations.measure():
            logits = self.model(x, operator, self.setup.dropout_rng, own_input=sampled)
            del x  # L exchanges forward; what backward needs of the input autograd holds
            train = self.train_mask[operator.rows]
            loss = F.cross_entropy(logits[train], self.setup.y[operator.rows][train],
                                   reduction="sum")
            del logits  # the loss keeps what its gradient needs; backward runs without [k, C]
            loss = loss / max(1, global_train_rows)
        if sampled:
            self.largest_step = max(self.largest_step, (self._operator_bytes(operator),
                                                        self._exchange_buffer_bytes(operator)))
        if large:
            release_free_heap()  # the forward's temporaries: not resident through backward's
        loss.backward()  # L exchanges backward
        return self._sum_gradients_and_loss(gradients(self.model), float(loss.detach()))

    def _sum_gradients_and_loss(self, grads: list[torch.Tensor], loss: float) -> float:
        """Phase 'gradient sum': one message of all gradients + the loss, summed over ranks; the
        sums go into every parameter's .grad and the summed loss is returned."""
        vector = flatten(grads + [torch.tensor([loss], dtype=self.dtype, device=self.device)])
        # mpifgl.finite: this rank's own loss and gradients, checked before the sum mixes them
        self.setup.finite.before_sum(loss, vector[:-1], self.model, "local gradient")
        segments = [p.numel() for p in self.model.parameters()] + [1]
        summed = self.comm.sum_to_all(vector.cpu(), segments).to(self.device)
        parameters = list(self.model.parameters())
        for p, grad in zip(parameters, unflatten(summed[:-1], parameters)):
            p.grad = grad
        return float(summed[-1])

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        """Full-graph forward (the exchange of every layer); [0, C] on the server."""
        self.start_pass("eval")
        if not self.comm.is_client:
            self.cross_sums.server_pass(self.full_operator.exchange, backward=False)
            return torch.zeros((0, self.setup.num_classes), dtype=self.dtype, device=self.device)
        self.model.eval()
        return self.model(self.x, self.full_operator)

    # -- what the run reports -------------------------------------------------------------------
    def rank_report(self) -> dict[str, Any]:
        """This rank's tensors by kind (``mpifgl.tensor_memory.tensor_report``): the features,
        the shard's adjacency and the full graph's operator, plus the largest step's operator;
        autograd's saved tensors; the exchange's buffers of the largest step (its largest chunk's
        send and receive rows and one exchange's result, at the widest propagation)."""
        step_operator, step_buffers = self.largest_step
        buffers = max(step_buffers, self._exchange_buffer_bytes(self.full_operator))
        # GCN's folded aggregate stands in for the features: the first layer's whole input
        folded = self.full_operator.input_has_self
        aggregates = [None if folded else self.input_aggregate, self.history]
        features = self.input_aggregate if folded else self.x
        memory = tensor_report(features, [held_adjacency(self.graph), self.full_operator.inner,
                                        self._plan_matrix(self.full_operator)],
                               self.activations.peak, None, self.model, self.optimizer,
                               more_buffer_bytes=buffers)
        memory["adjacency"] += step_operator
        memory["activations"] += nbytes(aggregates)  # --exact-first-layer, --history-every
        return {"tensor_bytes": memory}

    @staticmethod
    def _plan_matrix(operator: LayerOperator) -> Any:
        return None if operator.exchange is None else operator.exchange.send_rows

    def _operator_bytes(self, operator: LayerOperator) -> int:
        return nbytes(operator.inner, self._plan_matrix(operator), operator.row_scale,
                      operator.col_scale, operator.self_scale)

    def _exchange_buffer_bytes(self, operator: LayerOperator) -> int:
        """A client's buffers of one exchange of ``operator``'s plan: its largest chunk's send
        rows and owned rows and the exchange's result, at the widest propagation."""
        plan = operator.exchange
        if plan is None or plan.routing is None or self.cross_sums is None or plan.own_segment < 0:
            return 0
        routing, own = plan.routing, plan.own_segment
        send = int(np.diff(routing.send_bounds).max(initial=0))
        owned = max((int(routing.owned_rows(c)[own]) for c in range(routing.num_chunks)),
                    default=0)
        width = max(self.cross_sums.widths, default=0)
        return (send + owned + int(plan.segment_rows[own])) * width * self.dtype.itemsize

    # -- checkpoints: the random streams (saved by the Trainer) are all of a rank's own state --
    def rank_state(self) -> dict[str, Any]:
        """--history-every: the step count, and the history unless the next step refreshes it
        (a checkpoint at a refresh boundary stays small)."""
        if not self.history_period:
            return {}
        state: dict[str, Any] = {"steps_taken": self.steps_taken}
        if self.steps_taken % self.history_period:
            state["history"] = on_host(self.history)
        return state

    def restore_rank_state(self, state: dict[str, Any]) -> None:
        if self.history_period:
            self.steps_taken = state["steps_taken"]
            history = state.get("history")
            self.history = None if history is None else [
                (past.to(self.device), aggregate.to(self.device)) for past, aggregate in history]


def build_gnn(setup: RankSetup) -> GNNMethod:
    """``ours`` / ``centralized``: the label-guided (or uniform) sampler, or the full graph with
    ``--sampling none``."""
    return GNNMethod(setup, None if setup.config.sampling == "none"
                     else LabelGuidedSampler(setup))
