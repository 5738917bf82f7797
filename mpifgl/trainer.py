"""The run loop every method shares. One Trainer per rank; every rank runs the same phases in the
same order, so every collective is matched.

Per epoch: ``steps_per_epoch`` training steps (the method's: ``mpifgl.methods``), each followed
by the finite check (``mpifgl.finite``) -> evaluate (the method's logits of this rank's own
nodes, micro-F1 counted at the server) -> log -> checkpoint. At the end: model.pt, logits.npy
(optional) and final.json with the run's summary (times, bytes per rank, peak memory, best
epoch).

A method is built from a ``RankSetup`` (what every method starts from: config, communicator,
graph, global split counts, the rank's random streams) and brings only what it uses: its model,
optimizer and step (``TrainingMethod``).
"""
from __future__ import annotations

import logging
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import numpy as np
import torch

from fgl_common.shard_format import shard_filename
from fgl_common.shard_identity import partition_evidence, partition_problems
from mpifgl.communicator import Communicator
from mpifgl.config import TrainConfig
from mpifgl.failures import SetupError
from mpifgl.finite import FiniteGuard
from mpifgl.graph import ClientGraph
from mpifgl.model import GNN
from mpifgl.optim import SGD, Adam
from mpifgl.registry import OPTIMIZERS, lookup
from mpifgl.runlog import CHECKPOINT_NAME, RunDirectory
from mpifgl.sampling import group_counts, node_groups
from mpifgl.secure import MaskedSums, SecureSession

log = logging.getLogger("mpifgl")
SPLITS = ("train", "val", "test")
RANK_STATS = ("epoch_seconds", "compute_seconds", "comm_seconds", "bytes_sent",
              "bytes_received", "peak_rss_mb", "exchange_bytes_sent", "exchange_bytes_received",
              "peak_gpu_mb")
BYTE_STATS = ("bytes_sent", "bytes_received", "exchange_bytes_sent", "exchange_bytes_received")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_gpu_mb(device: torch.device) -> float:
    """The most memory torch has held on this rank's GPU (0 on the CPU)."""
    return torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else 0.0


def on_host(state: Any) -> Any:
    """A state dict (nested dicts and lists of tensors) with every tensor in host memory, so
    that model.pt and checkpoints load on any device."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: on_host(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_host(v) for v in state)
    return state


@dataclass
class RankSetup:
    """What every method of a rank starts from. ``create`` is collective (one sum over ranks).
    With --secure, ``comm`` masks its sums over ranks (``mpifgl.secure.MaskedSums``) and
    ``masking`` is the session the exchange masks with; the methods call the same sums either
    way."""

    config: TrainConfig
    comm: Communicator
    graph: ClientGraph
    num_classes: int
    dtype: torch.dtype
    y: torch.Tensor  # int64 [n_i]
    masks: dict[str, np.ndarray]  # split -> bool [n_i]
    groups: np.ndarray  # int64 [n_i]: each node's sampling group (label of a training node)
    global_group_counts: np.ndarray  # int64 [C + 1]: nodes per group over all clients
    global_split_counts: dict[str, int]  # split -> nodes over all clients
    # Independent, reproducible streams per rank for sampling and dropout (saved in checkpoints):
    # sampling draws on the host; dropout where it is applied (numpy on the CPU, a torch
    # generator on a GPU)
    sample_rng: np.random.Generator
    dropout_rng: "np.random.Generator | torch.Generator"
    # --secure: this run's keys (agreed in create, held in memory only); None without masking
    masking: SecureSession | None = None
    device: torch.device = torch.device("cpu")  # where this rank computes (--device)
    # the finite rule: a method's sum over ranks reports its share here (mpifgl.finite)
    finite: FiniteGuard | None = None
    # the merged graph, on the server of a method whose server holds it (registry's
    # ``server_loads_graph``); None elsewhere. The sums above count the clients' shards only
    whole_graph: ClientGraph | None = None

    @classmethod
    def create(cls, config: TrainConfig, comm: Communicator, graph: ClientGraph,
               num_classes: int, device: torch.device | str = "cpu",
               whole_graph: ClientGraph | None = None) -> "RankSetup":
        """One sum over ranks gives the global group counts (for the sampler) and split sizes,
        and checks that the clients' shards form one partition of one graph (every --algo and
        --exchange; a SetupError on every rank otherwise); with --secure the keys are agreed
        first (collective) and the sum is masked."""
        device = torch.device(device)
        masking = None
        if config.secure and not comm.is_single_process:
            masking = SecureSession.agree(comm)
            comm = MaskedSums(comm, masking)
        masks = {"train": graph.train_mask, "val": graph.val_mask, "test": graph.test_mask}
        groups = node_groups(graph.y, graph.train_mask, num_classes)
        counts = np.concatenate([group_counts(groups, num_classes),
                                 [int(masks[s].sum()) for s in SPLITS]]).astype(np.int64)
        evidence = partition_evidence(graph.client_id, graph.client_sizes, graph.global_id,
                                      graph.inner, graph.cross)
        local = np.concatenate([counts, evidence])
        totals = comm.sum_to_all(torch.from_numpy(local)).numpy()
        check_partition(totals[counts.shape[0]:], graph.client_sizes, config.shards,
                        comm.is_single_process)
        seeds = np.random.SeedSequence([config.seed, comm.rank]).generate_state(2)
        return cls(config, comm, graph, num_classes,
                   torch.float64 if config.dtype == "float64" else torch.float32,
                   torch.from_numpy(np.asarray(graph.y, dtype=np.int64)).to(device), masks,
                   groups, totals[:num_classes + 1],
                   dict(zip(SPLITS, (int(v) for v in totals[num_classes + 1:counts.shape[0]]))),
                   np.random.default_rng(int(seeds[0])), dropout_stream(int(seeds[1]), device),
                   masking, device, FiniteGuard(comm, sum_keeps_non_finite=masking is None),
                   whole_graph)

    def gnn_and_optimizer(self) -> tuple[GNN, "Adam | SGD"]:
        """The configured GNN (same initial weights on every rank) and its optimizer."""
        config = self.config
        model = GNN(config.backbone, self.graph.x.shape[1], config.hidden, self.num_classes,
                    config.layers, config.dropout, config.weight_seed, self.dtype).to(self.device)
        return model, self.optimizer_of(model)

    def optimizer_of(self, model: torch.nn.Module) -> "Adam | SGD":
        """``--optimizer`` over ``model``'s parameters, with --lr and --weight-decay."""
        config = self.config
        optimizer = lookup(OPTIMIZERS, "optimizer", config.optimizer).load()
        return optimizer(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    def mask(self, split: str) -> torch.Tensor:
        """bool [n_i] of ``split`` on this rank's device."""
        return torch.from_numpy(self.masks[split]).to(self.device)


def dropout_stream(seed: int, device: torch.device) -> "np.random.Generator | torch.Generator":
    """A rank's dropout stream: numpy's PCG64 on the CPU, a torch generator on a GPU."""
    if device.type == "cpu":
        return np.random.default_rng(seed)
    return torch.Generator(device=device).manual_seed(seed)


def stream_state(stream: "np.random.Generator | torch.Generator") -> dict[str, Any]:
    if isinstance(stream, torch.Generator):
        return {"torch_generator": stream.get_state(), "device": str(stream.device)}
    return stream.bit_generator.state


def restore_stream(stream: "np.random.Generator | torch.Generator", state: dict[str, Any],
                   fresh_seed: int) -> None:
    """Continue a dropout stream from a checkpoint's state; a checkpoint written on another
    kind of device (numpy's stream against a GPU generator) cannot be continued: the stream
    starts afresh from ``fresh_seed`` (weights, optimizer and sampling still continue exactly)."""
    saved_gpu = "torch_generator" in state
    if isinstance(stream, torch.Generator) and saved_gpu:
        stream.set_state(state["torch_generator"].cpu())
    elif not isinstance(stream, torch.Generator) and not saved_gpu:
        stream.bit_generator.state = state
    else:
        log.warning("the checkpoint's dropout stream was drawn on another kind of device: "
                    "dropout draws start afresh (weights, optimizer and sampling continue)")
        if isinstance(stream, torch.Generator):
            stream.manual_seed(fresh_seed)
        else:
            stream.bit_generator.state = np.random.default_rng(fresh_seed).bit_generator.state


def check_partition(total: np.ndarray, client_sizes: np.ndarray, shards: str,
                    merged: bool) -> None:
    """Raise SetupError (on every rank alike: ``total`` is the same everywhere) when the summed
    evidence shows that the shards are not one partition of one graph."""
    problems = partition_problems(total, client_sizes, shard_filename if not merged
                                  else lambda i: "the merged shards")
    if problems:
        raise SetupError(f"{shards}: the shards are not one partition of one graph: "
                         + "; ".join(problems) + f"; `python -m data_prep verify {shards}` "
                         "lists every problem")


class TrainingMethod(Protocol):
    """One rank's side of a method (``--algo``): what the run loop calls. ``train_step`` and
    ``full_logits`` are collective. Optional: ``phases`` (a ``PhaseMeter``: the epoch's phases
    in metrics.jsonl) and ``evaluated_nodes`` (``Trainer.evaluated_nodes``)."""

    config: TrainConfig  # resolved against the graph (sample size, steps per epoch)
    model: torch.nn.Module
    optimizer: "Adam | SGD"
    # A method may also hold ``setup_record``, on the server the traffic of its set-up phases
    # (``PhaseTraffic.record``): the first epoch's record and final.json carry it.

    def train_step(self) -> float:
        """One optimizer step (or FedAvg round) on every rank; the global loss."""
        ...

    def full_logits(self) -> torch.Tensor:
        """Logits of this rank's own nodes [n_i, C] for evaluation and --save-logits."""
        ...

    def rank_state(self) -> dict[str, Any]:
        """What this rank adds to a checkpoint besides its random streams (often nothing)."""
        ...

    def restore_rank_state(self, state: dict[str, Any]) -> None: ...


class PhaseTraffic:
    """The traffic of one phase of a method's set-up (FedGCN's pre-training round), which the
    epochs' counters never see: ``record`` (collective) gives the server every rank's bytes
    and the phase's seconds as ``{phase}_bytes_sent``, ``{phase}_bytes_received`` (lists by
    rank, exchange bytes included) and ``{phase}_seconds`` (the slowest rank's)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.start = self._counters()

    def _counters(self) -> np.ndarray:
        return np.asarray([self.comm.bytes_sent, self.comm.bytes_received, time.perf_counter()])

    def record(self, phase: str) -> dict[str, Any] | None:
        moved = self._counters() - self.start
        table = self.comm.gather_rows(torch.from_numpy(moved))
        if table is None:
            return None
        table = table.numpy()
        return {f"{phase}_bytes_sent": [int(v) for v in table[:, 0]],
                f"{phase}_bytes_received": [int(v) for v in table[:, 1]],
                f"{phase}_seconds": float(table[:, 2].max())}


class PhaseMeter:
    """Seconds and bytes (sent + received) of a method's named phases in the current epoch, on
    this rank: the method wraps each phase in ``with phases("name"):`` and keeps the meter as its
    ``phases``; the Trainer resets it every epoch and writes ``phases`` to metrics.jsonl,
    {name: {"seconds": [per rank], "bytes": [per rank]}} (rank 0 the server)."""

    def __init__(self, comm: Communicator, names: tuple[str, ...]):
        self.comm, self.names = comm, tuple(names)
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.names, 0.0)
        self.bytes = dict.fromkeys(self.names, 0)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, moved = time.perf_counter(), self.comm.bytes_sent + self.comm.bytes_received
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.bytes[name] += self.comm.bytes_sent + self.comm.bytes_received - moved

    def row(self) -> np.ndarray:
        """This rank's figures, one fixed-length row: every phase's seconds, then its bytes."""
        return np.asarray([self.seconds[n] for n in self.names] +
                          [self.bytes[n] for n in self.names], dtype=np.float64)

    def record(self, table: np.ndarray) -> dict[str, dict[str, list]]:
        """metrics.jsonl's ``phases`` from the gathered rows [ranks, 2 * phases]."""
        count = len(self.names)
        return {name: {"seconds": table[:, k].tolist(),
                       "bytes": [int(v) for v in table[:, count + k]]}
                for k, name in enumerate(self.names)}


@dataclass
class BestScore:
    val: float = -1.0
    test: float = 0.0
    epoch: int = 0
    train: float | None = None  # None in checkpoints written before it was recorded


class RunClock:
    """What the run's summary says (the server's view): wall time since set-up began, the
    training and evaluation time of the epochs this process ran, bytes and peak memory per
    rank, and when the validation micro-F1 first reached ``--target-val-f1``. A resumed run
    continues its checkpoint's record: ``earlier`` holds the figures of the parts before (each
    up to the checkpoint the next one continued from), so the totals of ``summary``
    (final.json) cover the whole run and ``parts`` says them apart.

    Time to accuracy counts two clocks, both of the server: ``elapsed`` = the training and
    evaluation seconds of every epoch so far (set-up, logging and checkpoints left out), and
    ``wall`` = seconds since the process started (set-up included), each over every part."""

    def __init__(self, target_val_f1: float = 0.0) -> None:
        self.started = time.perf_counter()
        self.epochs = self.evaluations = 0
        self.train_seconds = self.eval_seconds = 0.0
        self.bytes_per_rank: np.ndarray | None = None
        self.peak_rss_mb: np.ndarray | None = None
        self.earlier: list[dict[str, Any]] = []  # the parts before a resume (its checkpoint's)
        self.first_epoch = 1  # of this part
        self.target_val_f1 = target_val_f1
        # (epoch, elapsed, wall) of the first evaluation at or above the target; None: not yet
        self.reached: tuple[int, float, float] | None = None

    @property
    def elapsed(self) -> float:
        """Training and evaluation seconds of every epoch of the run so far, all parts."""
        return (sum(p["train_seconds"] + p["eval_seconds"] for p in self.earlier)
                + self.train_seconds + self.eval_seconds)

    @property
    def wall(self) -> float:
        """Seconds since the run's first process started, all parts (set-up included)."""
        return sum(p["wall_seconds"] for p in self.earlier) + time.perf_counter() - self.started

    def check_target(self, epoch: int, val_micro_f1: float) -> None:
        """Note the first epoch whose evaluation reaches the target (after add_epoch)."""
        if self.target_val_f1 > 0 and self.reached is None and val_micro_f1 >= self.target_val_f1:
            self.reached = (epoch, self.elapsed, self.wall)

    def add_epoch(self, train_seconds: float, eval_seconds: float, evaluated: bool,
                  table: np.ndarray) -> None:
        """One epoch; ``table`` is the gathered per-rank statistics (RANK_STATS columns)."""
        self.epochs += 1
        self.evaluations += int(evaluated)
        self.train_seconds += train_seconds
        self.eval_seconds += eval_seconds
        moved = table[:, RANK_STATS.index("bytes_sent")] + \
            table[:, RANK_STATS.index("bytes_received")]
        self.bytes_per_rank = moved if self.bytes_per_rank is None else self.bytes_per_rank + moved
        self.peak_rss_mb = table[:, RANK_STATS.index("peak_rss_mb")]  # a peak: the last is the max

    def part(self, last_epoch: int, identity: dict[str, Any]) -> dict[str, Any]:
        """This part's figures so far (``identity``: the run id and directory it ran in)."""
        return {**identity, "first_epoch": self.first_epoch, "last_epoch": last_epoch,
                "epochs_run": self.epochs, "evaluations": self.evaluations,
                "wall_seconds": time.perf_counter() - self.started,
                "train_seconds": self.train_seconds, "eval_seconds": self.eval_seconds,
                "bytes_per_rank": ([int(v) for v in self.bytes_per_rank]
                                   if self.bytes_per_rank is not None else []),
                "peak_rss_mb_per_rank": ([float(v) for v in self.peak_rss_mb]
                                         if self.peak_rss_mb is not None else [])}

    def record(self, last_epoch: int, identity: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint carries, so that a resume adds to it: every part so far."""
        return {"parts": self.earlier + [self.part(last_epoch, identity)],
                "reached": self.reached}

    def resume_from(self, record: dict[str, Any] | None, epoch: int) -> None:
        self.earlier = list((record or {}).get("parts", []))
        self.first_epoch = epoch + 1
        reached = (record or {}).get("reached")
        self.reached = tuple(reached) if reached else None

    def summary(self, last_epoch: int, identity: dict[str, Any]) -> dict[str, Any]:
        parts = self.record(last_epoch, identity)["parts"]
        epochs = sum(p["epochs_run"] for p in parts)
        train = sum(p["train_seconds"] for p in parts)
        moved = [np.asarray(p["bytes_per_rank"], dtype=np.int64) for p in parts
                 if p["bytes_per_rank"]]
        peaks = [np.asarray(p["peak_rss_mb_per_rank"]) for p in parts
                 if p["peak_rss_mb_per_rank"]]
        epoch, elapsed, wall = self.reached if self.reached else (None, None, None)
        return {"wall_seconds": sum(p["wall_seconds"] for p in parts),
                "target_val_micro_f1": self.target_val_f1 or None, "target_epoch": epoch,
                "seconds_to_target": elapsed, "wall_seconds_to_target": wall,
                "epochs_run": epochs, "evaluations": sum(p["evaluations"] for p in parts),
                "train_seconds": train, "mean_train_epoch_seconds": train / max(1, epochs),
                "eval_seconds": sum(p["eval_seconds"] for p in parts),
                "bytes_per_rank": [int(v) for v in np.sum(moved, axis=0)] if moved else [],
                "peak_rss_mb_per_rank": ([float(v) for v in np.max(peaks, axis=0)]
                                         if peaks else []),
                "parts": parts}


@dataclass
class TrainerState:
    """What a checkpoint must restore besides weights and optimizer: position and best score."""

    epoch: int = 0
    best: BestScore = field(default_factory=BestScore)


class Trainer:
    """The loop of one rank around one method: epochs, evaluation, metrics, checkpoints and the
    final outputs (written by the server)."""

    def __init__(self, setup: RankSetup, method: TrainingMethod, run_dir: RunDirectory | None,
                 run_info: dict[str, Any] | None = None):
        self.setup = setup
        self.method = method
        self.comm = setup.comm
        self.graph = setup.graph
        self.run_dir = run_dir
        self.run_info = run_info or {}
        self.state = TrainerState()
        self.position = "before the first epoch"  # for a failure message ("in epoch 3 of 200, ...")
        self.checkpoint_epoch = 0  # epoch of the last checkpoint saved or loaded (0: none)
        self.clock = RunClock(method.config.target_val_f1)
        self.longest_epoch_seconds = 0.0  # on this rank, all included: the watchdog's measure

    @property
    def config(self) -> TrainConfig:
        return self.method.config

    @property
    def model(self) -> torch.nn.Module:
        return self.method.model

    def train_step(self) -> float:
        return self.method.train_step()

    @property
    def phases(self) -> PhaseMeter | None:
        """The method's phase meter, if it measures phases (``PhaseMeter``)."""
        return getattr(self.method, "phases", None)

    def evaluated_nodes(self) -> tuple[torch.Tensor, dict[str, np.ndarray], np.ndarray]:
        """Labels, split masks and global ids of the rows of the method's ``full_logits``: this
        rank's own nodes, unless the method predicts other rows (its ``evaluated_nodes``:
        LLCG's server predicts the whole graph it holds, its clients nothing)."""
        nodes = getattr(self.method, "evaluated_nodes", None)
        return nodes if nodes is not None else (self.setup.y, self.setup.masks,
                                                self.graph.global_id)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float] | None:
        """Micro-F1 per split (= accuracy for single-label classes) of the method's logits,
        counted at the server. Returns the scores on the server, None elsewhere."""
        logits = self.method.full_logits()
        y, masks, _ = self.evaluated_nodes()
        correct = (logits.argmax(dim=1) == y).cpu().numpy()
        counts = np.asarray([correct[masks[s]].sum() for s in SPLITS], dtype=np.float64)
        totals = self.comm.sum_to_server(torch.from_numpy(counts))
        if totals is None:
            return None
        return {f"{s}_micro_f1": float(totals[k]) / max(1, self.setup.global_split_counts[s])
                for k, s in enumerate(SPLITS)}

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        config = self.config
        steps = config.steps_per_epoch
        for epoch in range(self.state.epoch + 1, config.epochs + 1):
            self.comm.reset_counters()
            if self.phases is not None:
                self.phases.reset()
            start = time.perf_counter()
            losses = []
            where = f"in epoch {epoch} of {config.epochs}"
            for step in range(1, steps + 1):
                self.position = f"{where}, step {step} of {steps}"
                losses.append(self.train_step())
                # no collective unless a value is non-finite (then every rank stops here)
                self.setup.finite.after_step(epoch, step, steps, losses[-1], self.model)
            train_seconds = time.perf_counter() - start
            train_comm = self.comm.seconds
            scores = None
            if epoch % config.eval_every == 0 or epoch == config.epochs:
                self.position = f"{where}, evaluating"
                scores = self.evaluate()
            epoch_seconds = time.perf_counter() - start
            self.position = f"{where}, logging"
            stats = np.asarray([epoch_seconds, train_seconds - train_comm, train_comm,
                                self.comm.bytes_sent, self.comm.bytes_received, peak_rss_mb(),
                                self.comm.exchange_bytes_sent, self.comm.exchange_bytes_received,
                                peak_gpu_mb(self.setup.device)])
            if self.phases is not None:
                stats = np.concatenate([stats, self.phases.row()])
            counters = self.comm.extra_counters()
            table = self.comm.gather_rows(torch.from_numpy(stats))
            self.state.epoch = epoch
            if self.comm.is_server:
                self.clock.add_epoch(train_seconds, epoch_seconds - train_seconds,
                                     scores is not None, table.numpy())
                self._record_epoch(epoch, float(np.mean(losses)), scores, table.numpy(),
                                   counters)
            if config.checkpoint_every and epoch % config.checkpoint_every == 0:
                self.position = f"while writing the checkpoint of epoch {epoch}"
                self.save_checkpoint()
            self.longest_epoch_seconds = max(self.longest_epoch_seconds,
                                             time.perf_counter() - start)
        self.position = "while writing the final outputs"
        return self.finish()

    def _record_epoch(self, epoch: int, loss: float, scores: dict[str, float] | None,
                      table: np.ndarray, counters: dict[str, int]) -> None:
        record: dict[str, Any] = {"epoch": epoch, "loss": loss, **counters,
                                  # the server's clocks through this epoch (RunClock)
                                  "elapsed_seconds": self.clock.elapsed,
                                  "wall_seconds": self.clock.wall}
        if self.clock.epochs == 1:  # this process's first epoch: its method's set-up phases
            record.update(getattr(self.method, "setup_record", None) or {})
        if scores is not None:
            record.update(scores)
            self.clock.check_target(epoch, scores["val_micro_f1"])
            if scores["val_micro_f1"] > self.state.best.val:
                self.state.best = BestScore(scores["val_micro_f1"], scores["test_micro_f1"], epoch,
                                            scores["train_micro_f1"])
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
        if self.setup.device.type == "cuda":  # torch.cuda.max_memory_allocated per rank
            record["peak_gpu_mb"] = per_rank["peak_gpu_mb"]
        if self.phases is not None:
            record["phases"] = self.phases.record(table[:, len(RANK_STATS):])
        assert self.run_dir is not None
        self.run_dir.append_metrics(record)
        if epoch % self.config.log_every == 0 or epoch == self.config.epochs:
            # each byte once: counted where it was sent and where it arrived, so halved
            moved = (sum(per_rank["bytes_sent"]) + sum(per_rank["bytes_received"])) / 2
            f1 = ("  micro-F1 train {train_micro_f1:.4f} val {val_micro_f1:.4f} test "
                  "{test_micro_f1:.4f}".format(**scores) if scores else " " * 46)
            log.info("epoch %4d  loss %.4f%s  time %6.3f s  traffic %8.2f MiB", epoch, loss, f1,
                     record["epoch_seconds"], moved / 2 ** 20)

    def finish(self) -> dict[str, Any] | None:
        """Final outputs: model.pt, logits.npy (optional), final.json."""
        logits_local = None
        if self.config.save_logits:
            logits_local = self.method.full_logits().cpu()
        parts = self.comm.gatherv_rows(logits_local) if logits_local is not None else None
        ids = (self.comm.gatherv_rows(torch.from_numpy(self.evaluated_nodes()[2][:, None]
                                                       .astype(np.int64)))
               if logits_local is not None else None)
        # what a method reports of each rank (its tensors' bytes by kind: mpifgl.tensor_memory)
        reports = (self.comm.gather_objects(self.method.rank_report())
                   if hasattr(self.method, "rank_report") else None)
        if not self.comm.is_server:
            return None
        assert self.run_dir is not None
        self.run_dir.save_torch("model.pt", on_host(self.model.state_dict()))
        if parts is not None and ids is not None:
            global_ids = np.concatenate([p[:, 0].numpy() for p in ids])
            stacked = np.concatenate([p.numpy() for p in parts])
            logits = np.empty_like(stacked)
            logits[global_ids] = stacked
            self.run_dir.save_logits(logits)
        best = self.state.best
        final = {"test_micro_f1": best.test, "best_val_micro_f1": best.val,
                 "best_train_micro_f1": best.train, "best_epoch": best.epoch,
                 "epochs": self.config.epochs, **self.run_info,
                 **self.clock.summary(self.state.epoch, self._identity()),
                 **(getattr(self.method, "setup_record", None) or {})}
        if reports is not None:
            final["rank_reports"] = reports
        self.run_dir.write_json("final.json", final)
        return final

    # -- checkpoints ----------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """The run this rank's records belong to: its id and directory (the server's)."""
        return {"run_id": self.run_info.get("run_id"),
                "run_dir": str(self.run_dir.path) if self.run_dir is not None else None}

    def _rank_state(self) -> dict[str, Any]:
        """What each rank contributes to a checkpoint: its random streams and the method's."""
        state = {"sample": self.setup.sample_rng.bit_generator.state,
                 "dropout": stream_state(self.setup.dropout_rng),
                 **self.method.rank_state()}
        if self.setup.masking is not None:  # --secure: the fixed-point ranges of every slot
            state["secure_ranges"] = self.setup.masking.ranges.state()
        return state

    def _restore_rank_state(self, state: dict[str, Any]) -> None:
        self.setup.sample_rng.bit_generator.state = state["sample"]
        fresh = int(np.random.SeedSequence([self.config.seed, self.comm.rank, self.state.epoch])
                    .generate_state(1)[0])
        restore_stream(self.setup.dropout_rng, state["dropout"], fresh)
        if self.setup.masking is not None and "secure_ranges" in state:
            self.setup.masking.ranges.restore(state["secure_ranges"])
        self.method.restore_rank_state(state)

    def save_checkpoint(self) -> None:
        states = self.comm.gather_objects(self._rank_state())
        if not self.comm.is_server:
            self.checkpoint_epoch = self.state.epoch  # the server writes it (or aborts the job)
            return
        assert self.run_dir is not None
        payload = {"config": self.config.to_dict(), "epoch": self.state.epoch,
                   "best": vars(self.state.best), "model": on_host(self.model.state_dict()),
                   "optimizer": on_host(self.method.optimizer.state_dict()), "rng": states,
                   "world_size": self.comm.size,
                   # which shards it was trained on: --resume refuses others
                   "shards_fingerprint": self.run_info.get("shards_fingerprint"),
                   "shards_description": self.run_info.get("shards_description"),
                   # whose checkpoint it is (--resume refuses one copied from another run), and
                   # the run's figures so far (a resume adds to them)
                   **self._identity(), "record": self.clock.record(self.state.epoch,
                                                                   self._identity())}
        self.run_dir.save_torch(CHECKPOINT_NAME, payload)
        self.checkpoint_epoch = self.state.epoch

    def load_checkpoint(self, payload: dict[str, Any] | None) -> None:
        """Restore from the server's checkpoint payload (None on clients: they get it by
        broadcast), so a resumed run continues bit for bit."""
        rng_states = payload.pop("rng") if payload is not None else None
        payload = self.comm.broadcast_object(payload)
        mine = self.comm.scatter_objects(rng_states)
        self.model.load_state_dict(payload["model"])
        self.method.optimizer.load_state_dict(payload["optimizer"])
        self.state = TrainerState(payload["epoch"], BestScore(**payload["best"]))
        self.checkpoint_epoch = self.state.epoch
        self.clock.resume_from(payload.get("record"), self.state.epoch)
        self._restore_rank_state(mine)
