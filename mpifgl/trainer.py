"""The training loop. One Trainer per rank; every rank runs the same phases in the same order,
so every collective is matched (the server runs them on a graph with no nodes).

Phases of one step: sample -> forward (one cross-client exchange per layer) -> loss ->
backward (the same exchange per layer, with gradients) -> gradient sum -> optimizer step.
Then per epoch: evaluate (full-graph forward) -> log -> checkpoint.

Loss weighting: the loss is the sum of cross-entropies over the training nodes in the step's
rows (all nodes, or the sample), divided by the GLOBAL number of such nodes. Without sampling this
is exactly the centralized mean cross-entropy, so gradients match centralized training.
"""
from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mpifgl.config import TrainConfig
from mpifgl.exchange import CrossClientExchange
from mpifgl.graph import ClientGraph, CrossExchangePlan, LayerOperator, build_operator, numpy_dtype
from mpifgl.model import GNN, flat_grads, make_features, select_rows, set_flat_grads
from mpifgl.optim import Adam
from mpifgl.runlog import CHECKPOINT_NAME, RunDirectory
from mpifgl.secure import SecureSession
from mpifgl.sampling import (NodeSample, NodeSampler, client_sample_sizes, group_counts, make_distribution,
                             node_groups, steps_for_sample)

log = logging.getLogger("mpifgl")
SPLITS = ("train", "val", "test")
RANK_STATS = ("epoch_seconds", "compute_seconds", "comm_seconds", "bytes_sent",
              "bytes_received", "peak_rss_mb", "exchange_bytes_sent", "exchange_bytes_received")
BYTE_STATS = ("bytes_sent", "bytes_received", "exchange_bytes_sent", "exchange_bytes_received")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class LocalComm:
    """The Communicator interface for one process holding the whole graph (centralized mode)."""

    rank, size, client_id, is_server = 0, 1, 0, True
    seconds, bytes_sent, bytes_received = 0.0, 0, 0
    exchange_bytes_sent, exchange_bytes_received = 0, 0

    def reset_counters(self) -> None:
        pass

    def sum_to_all(self, values: np.ndarray) -> np.ndarray:
        return values

    sum_to_server = sum_to_all

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        return np.asarray(row, dtype=np.float64)[None, :]

    def allgather_rows(self, row: np.ndarray) -> np.ndarray:
        return np.asarray(row, dtype=np.int64)[None, :]

    def gatherv_rows(self, rows: np.ndarray) -> list[np.ndarray]:
        return [rows]

    def broadcast_object(self, value: Any) -> Any:
        return value

    def gather_objects(self, value: Any) -> list[Any]:
        return [value]

    def scatter_objects(self, values: list[Any]) -> Any:
        return values[0]

    def agree_on_errors(self, error: str | None) -> list[tuple[int, int, str]]:
        return [(0, 0, error)] if error else []


@dataclass
class BestScore:
    val: float = -1.0
    test: float = 0.0
    epoch: int = 0


@dataclass
class TrainerState:
    """What a checkpoint must restore besides weights and optimizer: position and best score."""

    epoch: int = 0
    best: BestScore = field(default_factory=BestScore)


class Trainer:
    # False for the baselines: they bring their own sampling (or none) and one step per epoch.
    uses_node_sampler = True

    def __init__(self, config: TrainConfig, comm: Any, graph: ClientGraph, num_classes: int,
                 run_dir: RunDirectory | None, run_info: dict[str, Any] | None = None):
        self.config = config
        self.comm = comm
        self.graph = graph
        self.num_classes = num_classes
        self.run_dir = run_dir
        self.run_info = run_info or {}
        self.distributed = not isinstance(comm, LocalComm)
        # The server of a distributed run: it takes part in every collective, computes nothing.
        self.serves_no_nodes = self.distributed and graph.client_id < 0
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.numpy_dtype = numpy_dtype(self.dtype)
        self.x = make_features(graph.x, self.dtype, config.feature_format)
        self.y = torch.from_numpy(np.asarray(graph.y, dtype=np.int64))
        self.masks = {"train": graph.train_mask, "val": graph.val_mask, "test": graph.test_mask}
        self.model = GNN(config.backbone, graph.x.shape[1], config.hidden, num_classes,
                         config.layers, config.dropout, config.weight_seed, self.dtype)
        self.optimizer = Adam(self.model.parameters(), lr=config.lr,
                                          weight_decay=config.weight_decay)
        # Independent, reproducible streams per rank for sampling and dropout.
        seeds = np.random.SeedSequence([config.seed, comm.rank]).generate_state(2)
        self.sample_rng = np.random.default_rng(int(seeds[0]))
        self.dropout_rng = np.random.default_rng(int(seeds[1]))
        # --secure: keys agreed once per run (collective), held in memory only
        self.secure = (SecureSession.agree(comm) if config.secure and self.distributed
                       else None)
        self.exchange = (CrossClientExchange(comm, config.exchange,
                                             int(config.exchange_buffer_mb * 2 ** 20),
                                             max(self.model.widths[1:]), self.numpy_dtype,
                                             self.secure)
                         if self.distributed else None)
        self.state = TrainerState()
        self._setup_counts_and_sampler()
        if self.config.steps_per_epoch == 0:
            self.config = self.config.replace(steps_per_epoch=self.auto_steps_per_epoch())
        self.full_operator = self.prepared(build_operator(graph, config.backbone, None, None,
                                                         self.dtype, exchanged=self.distributed))

    # -- set-up ---------------------------------------------------------------------------------
    def _setup_counts_and_sampler(self) -> None:
        """One sum over clients gives the global group counts (for Q) and split sizes."""
        c = self.num_classes
        groups = node_groups(self.graph.y, self.graph.train_mask, c)
        local = np.concatenate([group_counts(groups, c),
                                [int(self.masks[s].sum()) for s in SPLITS]]).astype(np.int64)
        totals = (self.secure.sum_to_all(self.comm, local) if self.secure is not None
                  else self.comm.sum_to_all(local))
        self.global_group_counts = totals[:c + 1]
        self.global_split_counts = dict(zip(SPLITS, (int(v) for v in totals[c + 1:])))
        self.sampler: NodeSampler | None = None
        self.draws_per_client: np.ndarray | None = None  # s_i; None: no node sampling
        if self.config.sampling == "none" or not self.uses_node_sampler:
            return
        n = int(self.graph.client_sizes.sum())
        total_draws = self.config.sample_size or max(1, -(-n // 4))
        self.config = self.config.replace(sample_size=total_draws)  # recorded resolved
        draws = client_sample_sizes(self.graph.client_sizes, total_draws)
        if self.graph.client_id >= 0:
            distribution = make_distribution(self.config.sampling, groups, self.global_group_counts)
            self.sampler = NodeSampler(distribution, int(draws[self.graph.client_id]),
                                       self.sample_rng, normalize=not self.config.no_normalize)
        self.draws_per_client = draws

    def prepared(self, operator: LayerOperator) -> LayerOperator:
        """Agree on the operator's exchange chunks with the other ranks (collective: the compact
        exchanges send their row ids to the server here, once per operator)."""
        if self.exchange is not None and operator.exchange is not None:
            self.exchange.prepare(operator.exchange)
        return operator

    def auto_steps_per_epoch(self) -> int:
        """``--steps-per-epoch 0``: with node sampling, ceil(n / s - 1e-6) steps (4 at the default
        s = ceil(n / 4); s = floor(n / 4) can give 5, as n / s = 4.0000016 on ogbn-products), so
        an epoch draws about n nodes, one pass over the graph as in any mini-batch trainer;
        without it, one full-graph step. Why several sampled steps rather than one, and why not
        smaller samples: docs/training.md (steps per epoch). The baselines take 1: their epochs
        are already passes over their data."""
        if self.draws_per_client is None:
            return 1
        return steps_for_sample(int(self.graph.client_sizes.sum()),
                                int(self.draws_per_client.sum()))

    def sample_capacity(self) -> int:
        """The most nodes any client's sample can hold, the same on every rank: s_i draws give at
        most s_i distinct nodes; another sampler (BNS-GCN) at most the largest client."""
        if self.draws_per_client is not None:
            return int(self.draws_per_client.max())
        return int(self.graph.client_sizes.max())

    # -- one step -------------------------------------------------------------------------------
    def sample_operator(self) -> tuple[LayerOperator, int]:
        """Phase 'sample': this step's operator and the global count of training rows in it."""
        if self.sampler is None and self.config.sampling == "none":
            return self.full_operator, self.global_split_counts["train"]
        return self.operator_for_sample(self.sampler.sample() if self.sampler is not None else None)

    def operator_for_sample(self, sample: NodeSample | None) -> tuple[LayerOperator, int]:
        """Share every client's sample (sorted local index + p(u); None on the server) and build
        this rank's operator for their union, with the global count of training rows in it.
        Collective: every rank calls it once per step. Any sampler can feed it (e.g. BNS-GCN)."""
        index = sample.index if sample is not None else np.zeros(0, dtype=np.int64)
        probability = sample.probability if sample is not None else np.zeros(0)
        train_rows = int(self.graph.train_mask[index].sum())
        # One Allgather of fixed-length rows [size, train rows, index, padding]: with 9 ranks on
        # 2 cores an Allgatherv of the indices took 4.5-6 ms, an Allgather of small rows 0.7 ms.
        capacity = self.sample_capacity()
        if index.shape[0] > capacity:
            raise ValueError(f"a sample of {index.shape[0]} nodes on client "
                             f"{self.graph.client_id}, expected at most {capacity}")
        packed = np.full(2 + capacity, -1, dtype=np.int64)
        packed[:2] = index.shape[0], train_rows
        packed[2:2 + index.shape[0]] = index
        table = self.comm.allgather_rows(packed)
        by_rank = [row[2:2 + row[0]] for row in table]
        samples = by_rank[1:] if self.distributed else by_rank
        operator = self.prepared(build_operator(self.graph, self.config.backbone, samples,
                                                probability, self.dtype,
                                                exchanged=self.distributed))
        return operator, int(table[:, 1].sum())

    def loss_and_gradients(self, operator: LayerOperator, global_train_rows: int) -> float:
        """Phases forward, loss, backward, gradient sum: leaves the GLOBAL gradient in every
        parameter's .grad on every rank and returns the global loss."""
        if self.serves_no_nodes:
            return self._server_loss_and_gradients(operator.exchange)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        # The full-graph operator's rows are all nodes in order: no copy of the features.
        x = self.x if operator is self.full_operator else select_rows(self.x, operator.rows)
        logits = self.model(x, operator, self.exchange, self.dropout_rng)
        train = torch.from_numpy(self.masks["train"][operator.rows])
        loss = F.cross_entropy(logits[train], self.y[operator.rows][train], reduction="sum")
        loss = loss / max(1, global_train_rows)
        loss.backward()
        return self._sum_gradients_and_loss(flat_grads(self.model), float(loss.detach()))

    def _sum_gradients_and_loss(self, grads: np.ndarray, loss: float) -> float:
        """Phase 'gradient sum': one message of all gradients + the loss, summed over ranks; the
        sums go into every parameter's .grad and the summed loss is returned."""
        vector = np.append(grads, np.asarray(loss, dtype=grads.dtype))
        if self.secure is not None:  # zero-sum masks: the server learns only the totals
            segments = [p.numel() for p in self.model.parameters()] + [1]
            summed = self.secure.sum_to_all(self.comm, vector, segments)
        else:
            summed = self.comm.sum_to_all(vector)
        set_flat_grads(self.model, summed[:-1])
        return float(summed[-1])

    # -- the server's share of a step: sums only ---------------------------------------------
    def _server_exchanges(self, plan: CrossExchangePlan, backward: bool) -> None:
        """The cross-client exchanges of one forward pass (layers 1..L) and, when training, of
        its backward pass (layers L..1), in the order every client's autograd runs them. The
        server contributes zeros to each sum: it has no nodes, so it builds no operator and
        runs no model (doing so on an empty graph cost it, in cProfile, about half of a client's
        CPU per step outside MPI)."""
        widths = self.model.widths[1:]
        for width in widths + (widths[::-1] if backward else []):
            self.exchange(plan, torch.zeros((0, width), dtype=self.dtype))

    def _server_loss_and_gradients(self, plan: CrossExchangePlan) -> float:
        self._server_exchanges(plan, backward=True)
        size = sum(p.numel() for p in self.model.parameters())
        return self._sum_gradients_and_loss(np.zeros(size, dtype=self.numpy_dtype), 0.0)

    def train_step(self) -> float:
        operator, global_train_rows = self.sample_operator()
        loss = self.loss_and_gradients(operator, global_train_rows)
        self.optimizer.step()
        return loss

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        if self.serves_no_nodes:
            self._server_exchanges(self.full_operator.exchange, backward=False)
            return torch.zeros((0, self.num_classes), dtype=self.dtype)
        self.model.eval()
        return self.model(self.x, self.full_operator, self.exchange)

    def evaluate(self) -> dict[str, float] | None:
        """Full-graph forward; micro-F1 per split (= accuracy for single-label classes), counted
        at the server. Returns the scores on the server, None elsewhere."""
        logits = self.full_logits()
        correct = (logits.argmax(dim=1) == self.y).numpy()
        counts = np.asarray([correct[self.masks[s]].sum() for s in SPLITS], dtype=np.float64)
        totals = (self.secure.sum_to_server(self.comm, counts) if self.secure is not None
                  else self.comm.sum_to_server(counts))
        if totals is None:
            return None
        return {f"{s}_micro_f1": float(totals[k]) / max(1, self.global_split_counts[s])
                for k, s in enumerate(SPLITS)}

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        config = self.config
        for epoch in range(self.state.epoch + 1, config.epochs + 1):
            self.comm.reset_counters()
            start = time.perf_counter()
            losses = [self.train_step() for _ in range(config.steps_per_epoch)]
            train_seconds = time.perf_counter() - start
            train_comm = self.comm.seconds
            scores = None
            if epoch % config.eval_every == 0 or epoch == config.epochs:
                scores = self.evaluate()
            epoch_seconds = time.perf_counter() - start
            stats = np.asarray([epoch_seconds, train_seconds - train_comm, train_comm,
                                self.comm.bytes_sent, self.comm.bytes_received, peak_rss_mb(),
                                self.comm.exchange_bytes_sent, self.comm.exchange_bytes_received])
            table = self.comm.gather_rows(stats)
            self.state.epoch = epoch
            if self.comm.is_server:
                self._record_epoch(epoch, float(np.mean(losses)), scores, table)
            if config.checkpoint_every and epoch % config.checkpoint_every == 0:
                self.save_checkpoint()
        return self.finish()

    def _record_epoch(self, epoch: int, loss: float, scores: dict[str, float] | None,
                      table: np.ndarray) -> None:
        record: dict[str, Any] = {"epoch": epoch, "loss": loss}
        if scores is not None:
            record.update(scores)
            if scores["val_micro_f1"] > self.state.best.val:
                self.state.best = BestScore(scores["val_micro_f1"], scores["test_micro_f1"], epoch)
        # Training time only (evaluation excluded from compute/comm, included in epoch_seconds);
        # rank 0 is the server, rank r the client r - 1.
        per_rank = {name: table[:, k].tolist() for k, name in enumerate(RANK_STATS)}
        for name in BYTE_STATS:
            per_rank[name] = [int(v) for v in per_rank[name]]
        record.update({"epoch_seconds": float(table[:, 0].max()),
                       "compute_seconds": float(table[:, 1].max()),
                       "comm_seconds": float(table[:, 2].max()), "per_rank": per_rank,
                       "bytes_sent": per_rank["bytes_sent"],
                       "bytes_received": per_rank["bytes_received"],
                       "exchange_bytes_sent": per_rank["exchange_bytes_sent"],
                       "exchange_bytes_received": per_rank["exchange_bytes_received"],
                       "peak_rss_mb": per_rank["peak_rss_mb"]})
        assert self.run_dir is not None
        self.run_dir.append_metrics(record)
        if epoch % self.config.log_every == 0 or epoch == self.config.epochs:
            moved_mb = (sum(per_rank["bytes_sent"]) + sum(per_rank["bytes_received"])) / 2 ** 20
            f1 = ("  micro-F1 train {train_micro_f1:.4f} val {val_micro_f1:.4f} test "
                  "{test_micro_f1:.4f}".format(**scores) if scores else " " * 46)
            # traffic: bytes sent + received over all ranks, halved (each byte counted once)
            log.info("epoch %4d  loss %.4f%s  time %6.3f s  traffic %8.2f MB", epoch, loss, f1,
                     record["epoch_seconds"], moved_mb)

    def finish(self) -> dict[str, Any] | None:
        """Final outputs: model.pt, logits.npy (optional), final.json."""
        logits_local = None
        if self.config.save_logits:
            logits_local = self.full_logits().numpy()
        parts = self.comm.gatherv_rows(logits_local) if logits_local is not None else None
        ids = (self.comm.gatherv_rows(self.graph.global_id[:, None].astype(np.int64))
               if logits_local is not None else None)
        if not self.comm.is_server:
            return None
        assert self.run_dir is not None
        self.run_dir.save_torch("model.pt", self.model.state_dict())
        if parts is not None and ids is not None:
            global_ids = np.concatenate([p[:, 0] for p in ids])
            stacked = np.concatenate(parts)
            logits = np.empty_like(stacked)
            logits[global_ids] = stacked
            self.run_dir.save_logits(logits)
        best = self.state.best
        final = {"test_micro_f1": best.test, "best_val_micro_f1": best.val,
                 "best_epoch": best.epoch, "epochs": self.config.epochs, **self.run_info}
        self.run_dir.write_json("final.json", final)
        return final

    # -- checkpoints ----------------------------------------------------------------------------
    def _rng_state(self) -> dict[str, Any]:
        return {"sample": self.sample_rng.bit_generator.state,
                "dropout": self.dropout_rng.bit_generator.state}

    def _rank_state(self) -> dict[str, Any]:
        """What each rank contributes to a checkpoint (a subclass may add per-rank state)."""
        return self._rng_state()

    def _restore_rank_state(self, state: dict[str, Any]) -> None:
        self.sample_rng.bit_generator.state = state["sample"]
        self.dropout_rng.bit_generator.state = state["dropout"]

    def save_checkpoint(self) -> None:
        states = self.comm.gather_objects(self._rank_state())
        if not self.comm.is_server:
            return
        assert self.run_dir is not None
        payload = {"config": self.config.to_dict(), "epoch": self.state.epoch,
                   "best": vars(self.state.best), "model": self.model.state_dict(),
                   "optimizer": self.optimizer.state_dict(), "rng": states,
                   "world_size": self.comm.size}
        self.run_dir.save_torch(CHECKPOINT_NAME, payload)

    def load_checkpoint(self, payload: dict[str, Any] | None) -> None:
        """Restore from the server's checkpoint payload (None on clients: they get it by
        broadcast), so a resumed run continues bit for bit."""
        rng_states = payload.pop("rng") if payload is not None else None
        payload = self.comm.broadcast_object(payload)
        mine = self.comm.scatter_objects(rng_states)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.state = TrainerState(payload["epoch"], BestScore(**payload["best"]))
        self._restore_rank_state(mine)
