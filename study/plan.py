"""The study's plan: every training run behind the paper's tables and figures, deduplicated
(a run shared by two sections runs once), and the cost model that orders them and gives the ETA.

Pure functions of a ``StudyConfig`` and the dataset sizes: nothing here starts a process.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from mpifgl.config import TrainConfig
from study.catalog import METHODS, REFERENCE_METHOD, algo_of, methods_of
from study.config import StudyConfig

LR_GRID = (0.1, 0.01, 0.001)  # the paper's lr search

# -- one run ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One training run; ``key`` names its directory under REPORT_DIR/runs."""

    dataset: str
    method: str
    num_clients: int  # shards used; centralized methods read the same shards merged
    partition: str  # data_prep's --partition (random, label-skew, louvain, ...)
    seed: int
    epochs: int
    lr: float
    flags: tuple[str, ...] = ()  # extra mpifgl.train flags beyond the method's (figure 5)
    tag: str = ""  # names the extra flags in the key
    timeout: float = 900.0  # seconds before the run is killed and recorded as failed

    @property
    def key(self) -> str:
        variant = f"{self.method}-{self.tag}" if self.tag else self.method
        return (f"{self.dataset}/{self.partition}-m{self.num_clients}/"
                f"{variant}-lr{self.lr:g}-e{self.epochs}-s{self.seed}")

    @property
    def distributed(self) -> bool:
        return METHODS[self.method].distributed

    @property
    def ranks(self) -> int:
        return self.num_clients + 1 if self.distributed else 1

    @property
    def shard_name(self) -> str:
        return f"{self.dataset}-{self.partition}-m{self.num_clients}-s0"

    def identity(self) -> dict:
        """Everything that defines the run (timeout excluded: it changes no result)."""
        values = asdict(self)
        values.pop("timeout")
        values["flags"] = list(self.flags)
        return values


# -- the plan -----------------------------------------------------------------------------------
@dataclass
class PlannedRun:
    spec: RunSpec
    sections: list[str] = field(default_factory=list)
    reference: str | None = None  # key of the centralized run its local bias is measured against
    noise_reference: str | None = None  # key of a second centralized run (other seed)
    # key of a centralized run with the reference's initial weights and other dropout streams
    same_init_reference: str | None = None


@dataclass
class Plan:
    runs: dict[str, PlannedRun] = field(default_factory=dict)  # key -> run, in execution order
    lr_choice: dict[str, float] = field(default_factory=dict)  # "dataset/method" -> lr

    def add(self, spec: RunSpec, section: str) -> PlannedRun:
        planned = self.runs.setdefault(spec.key, PlannedRun(spec))
        if section not in planned.sections:
            planned.sections.append(section)
        return planned

    def to_json(self) -> dict:
        return {"lr_choice": self.lr_choice,
                "runs": [{"key": k, **p.spec.identity(), "sections": p.sections,
                          "reference": p.reference, "noise_reference": p.noise_reference,
                          "same_init_reference": p.same_init_reference,
                          "distributed": p.spec.distributed, "ranks": p.spec.ranks,
                          "shard_name": p.spec.shard_name}
                         for k, p in self.runs.items()]}


KNOWN_NUM_NODES = {"cora": 2708, "citeseer": 3327, "amazon-computers": 13752,
                   "coauthor-cs": 18333}
KNOWN_NUM_TRAIN = {"cora": 1208, "citeseer": 1827, "amazon-computers": 8252,
                   "coauthor-cs": 11000}  # for --dry-run before any shard exists


# Mini-batch steps per epoch of the sampling baselines, from the trainer's defaults
# (mpifgl.config.TrainConfig: --batch-size 512 seeds / walk roots, --walk-length 2).
MINIBATCH_SIZE = 512
WALK_NODES = MINIBATCH_SIZE * 3  # roots x (walk length + 1): GraphSAINT's subgraph, at most


def equal_step_epochs(method: str, epochs: int, num_nodes: int, num_train: int,
                      min_epochs: int = 1) -> int:
    """Epochs of ``method`` that make about ``epochs`` optimizer steps, but at least
    ``min_epochs`` (and never more than ``epochs``). GraphSAGE: one pass = ceil(n_train / 512)
    steps; GraphSAINT: one pass = about n / (512 x 3) subgraphs (an upper bound on a subgraph's
    size, so it takes a few more steps, never fewer). Others: one step per epoch, ``epochs``
    unchanged."""
    algo = algo_of(method)
    if algo == "graphsage":
        per_epoch = max(1, math.ceil(num_train / MINIBATCH_SIZE))
    elif algo == "graphsaint":
        per_epoch = max(1, round(num_nodes / WALK_NODES))
    else:
        return epochs
    return min(epochs, max(1, min_epochs, math.ceil(epochs / per_epoch)))


def method_epochs(config: StudyConfig, method: str, dataset: str, epochs: int,
                  num_nodes: Callable[[str], int] | None,
                  num_train: Callable[[str], int] | None) -> int:
    """``epochs`` of a run of ``method``: the equal-steps rule for the mini-batch baselines
    when the study applies it and the dataset's sizes are known."""
    if not config.equal_steps or num_nodes is None or num_train is None:
        return epochs
    return equal_step_epochs(method, epochs, num_nodes(dataset), num_train(dataset),
                             config.min_minibatch_epochs)


def lr_for(dataset: str, method: str, lr_of: Callable[[str, str], float]) -> float:
    """The lr of ``method``'s runs: its own (the catalog's), else the study's (``lr_of``)."""
    own = METHODS[method].lr
    return own if own is not None else lr_of(dataset, method)


def build_plan(config: StudyConfig, lr_of: Callable[[str, str], float],
               num_nodes: Callable[[str], int],
               num_train: Callable[[str], int] | None = None) -> Plan:
    """All runs of the selected sections, deduplicated by key (a run shared by two sections,
    e.g. ours at 8 clients in Table 2 and Figure 3, runs once)."""
    plan = Plan()

    def spec(dataset: str, method: str, clients: int, seed: int, epochs: int,
             partition: str = "random", **extra) -> RunSpec:
        return RunSpec(dataset, method, clients, partition, seed,
                       method_epochs(config, method, dataset, epochs, num_nodes, num_train),
                       lr_for(dataset, method, lr_of), timeout=config.timeout, **extra)

    def with_bias(run: PlannedRun, section: str, epochs: int) -> None:
        """Attach the centralized reference (same seed) and two noise references: another seed
        (other initial weights and dropout), and another seed with the reference's initial
        weights (--init-seed: dropout streams differ only). Every distributed run shares its
        initial weights with its reference, so the second floor is the like-for-like one."""
        s = run.spec
        ref = plan.add(spec(s.dataset, REFERENCE_METHOD, config.main_clients, s.seed, epochs),
                       section)
        noise_seed = s.seed + 1
        noise = plan.add(spec(s.dataset, REFERENCE_METHOD, config.main_clients, noise_seed,
                              epochs),
                         section)
        same_init = plan.add(spec(s.dataset, REFERENCE_METHOD, config.main_clients, noise_seed,
                                  epochs, flags=("--init-seed", str(s.seed)),
                                  tag=f"init{s.seed}"), section)
        run.reference, run.noise_reference = ref.spec.key, noise.spec.key
        run.same_init_reference = same_init.spec.key
        if ref.noise_reference is None:
            ref.reference, ref.noise_reference = ref.spec.key, noise.spec.key
            ref.same_init_reference = same_init.spec.key

    sections = set(config.only)

    def rows_of(section: str) -> tuple[str, ...]:
        """The section's rows that --methods keeps (all without it)."""
        rows = methods_of(section)
        return tuple(m for m in rows if m in config.methods) if config.methods else rows

    if "table2" in sections:
        for dataset in config.datasets:
            for method in rows_of("table2"):
                for seed in config.seeds:
                    plan.add(spec(dataset, method, config.main_clients, seed,
                                  config.epochs_for(dataset)), "table2")
    figure_datasets = [d for d in config.figure_datasets if d in config.datasets] or \
        list(config.datasets[:1])
    for dataset in figure_datasets:
        for seed in config.figure_seeds:
            e = config.figure_epochs
            if "fig3" in sections:
                for clients in config.client_counts:
                    for method in rows_of("fig3"):
                        with_bias(plan.add(spec(dataset, method, clients, seed, e), "fig3"),
                                  "fig3", e)
            if "fig4" in sections:
                for partition in config.figure_partitions:
                    for method in rows_of("fig4"):
                        run = plan.add(spec(dataset, method, config.main_clients, seed, e,
                                            partition), "fig4")
                        with_bias(run, "fig4", e)
            if "table3" in sections:
                for clients in config.overhead_clients:
                    for method in rows_of("table3"):
                        plan.add(spec(dataset, method, clients, seed, e), "table3")
            if "fig6" in sections:
                for method in rows_of("fig6"):
                    plan.add(spec(dataset, method, config.main_clients, seed, e), "fig6")
            if "fig5" in sections:
                per_epoch = max(len(config.step_lengths),
                                round(config.fig5_nodes_fraction * num_nodes(dataset)))
                for method in rows_of("fig5"):
                    for steps in config.step_lengths:
                        size = max(1, per_epoch // steps)
                        plan.add(spec(dataset, method, config.main_clients, seed,
                                      config.fig5_epochs, flags=("--steps-per-epoch", str(steps),
                                                                 "--sample-size", str(size)),
                                      tag=f"k{steps}"), "fig5")
    if "table5" in sections:
        ablation = [d for d in config.ablation_datasets if d in config.datasets]
        for dataset in ablation or config.datasets[:1]:
            for method in rows_of("table5"):
                for seed in config.seeds:
                    plan.add(spec(dataset, method, config.main_clients, seed,
                                  config.epochs_for(dataset)), "table5")
    return plan


def lr_search_plan(config: StudyConfig, num_nodes: Callable[[str], int] | None = None,
                   num_train: Callable[[str], int] | None = None) -> list[RunSpec]:
    """Seed seeds[0] of every Table 2 (and ablation) method at every lr of the grid."""
    methods = list(methods_of("table2")) if "table2" in config.only else []
    if "table5" in config.only:
        methods += [m for m in methods_of("table5") if m not in methods]
    methods = [m for m in methods if not config.methods or m in config.methods]
    return [RunSpec(d, m, config.main_clients, "random", config.seeds[0],
                    method_epochs(config, m, d, config.epochs_for(d), num_nodes, num_train), lr,
                    timeout=config.timeout)
            for d in config.datasets for m in methods if METHODS[m].lr is None
            for lr in LR_GRID]


# -- cost model (for the plan's ETA before any run has finished) ---------------------------------
# Calibrated on the idle 2-core VM with one thread per rank (docs/experiments.md): launch cost
# (mpirun, importing torch in every rank, loading shards) and seconds per epoch per 1,000 nodes
# (train + full-graph evaluation). The driver rescales it per method with every run measured.
STARTUP_SECONDS = {"single": 5.0, "per_rank": 1.5}
EPOCH_SECONDS_PER_KNODE = {"single": 0.02, "distributed": 0.05}
# LLCG's round is K neighbour-sampled steps on every client whatever the graph's size: a cost
# per step (8 clients), calibrated as the others (docs/experiments.md).
LLCG_STEP_SECONDS = 0.056


def flag_value(flags: tuple[str, ...], name: str, default: int) -> int:
    """The integer after ``name`` in ``flags``, else ``default``."""
    return int(flags[flags.index(name) + 1]) if name in flags else default


def estimate_seconds(spec: RunSpec, num_nodes: int) -> float:
    kind = "distributed" if spec.distributed else "single"
    startup = STARTUP_SECONDS["single"] + (STARTUP_SECONDS["per_rank"] * spec.ranks
                                           if spec.distributed else 0.0)
    steps = flag_value(spec.flags, "--steps-per-epoch", 1)
    per_epoch = EPOCH_SECONDS_PER_KNODE[kind] * num_nodes / 1000 * (1 + 0.3 * (steps - 1))
    per_epoch *= 1 + 0.05 * max(0, spec.num_clients - 8) if spec.distributed else 1
    if METHODS[spec.method].algo == "llcg":
        local_steps = flag_value(METHODS[spec.method].flags + spec.flags, "--llcg-local-steps",
                                 TrainConfig.llcg_local_steps)
        per_epoch += local_steps * LLCG_STEP_SECONDS * spec.num_clients / 8
    return startup + spec.epochs * per_epoch

