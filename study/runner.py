"""The study: every run behind the paper's tables and figures, resumable, with a report.

    python -m mpifgl.experiments --datasets cora,citeseer,amazon-computers,coauthor-cs \
        --out reports/study [--seeds 0,1,2] [--epochs N] [--quick] [--only table2,fig3,...] \
        [--data-root DIR] [--lr-search] [--same-epochs] [--budget-minutes M] [--dry-run] \
        [--retry-failed]

What it does, in order:
 1. builds the plan (``build_plan``): a deduplicated list of ``RunSpec`` per report section;
 2. checks which ``--algo`` values import (baselines written later plug in by name; a method
    that does not import is recorded as unavailable, not run);
 3. prepares the shards it needs with ``data_prep.api.prepare_shards`` (reused when present);
 4. runs every run as a subprocess (``mpirun -n M+1`` for distributed algorithms) with a
    timeout, logging ``run i/N ... elapsed, ETA``; a run whose ``final.json`` exists is skipped,
    a half-done run directory is removed and redone, a failure is recorded in the run
    directory's ``FAILED.json`` and the study goes on (``--retry-failed`` runs those again);
 5. writes ``plan.json`` and hands over to ``mpifgl.report`` (CSV, Markdown, PNG plots).

The study launches subprocesses only: it never imports mpi4py (nor torch).

Learning rate: the default is one fixed lr (0.01, the paper's middle value) for every method,
because the search triples the cost of the main table. ``--lr-search`` runs seed ``seeds[0]`` of
every (dataset, method) of Table 2 at 0.1, 0.01 and 0.001, picks the best validation micro-F1
and runs all seeds (and every other section using that method and dataset) at that lr.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from mpifgl.algorithms import get_algorithm
from mpifgl.report import read_json, write_report

log = logging.getLogger("mpifgl.experiments")
SECTIONS = ("table2", "fig3", "fig4", "table4", "table5", "fig5", "fig6")
LR_GRID = (0.1, 0.01, 0.001)


# -- methods ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """A row of the report: an ``--algo`` plus the flags that make the variant."""

    name: str  # label in the report and in run directory names
    algo: str  # mpifgl.train --algo
    flags: tuple[str, ...] = ()  # extra mpifgl.train flags
    label: str = ""  # pretty name for tables

    @property
    def distributed(self) -> bool:
        return get_algorithm(self.algo).distributed


METHODS = {m.name: m for m in (
    Method("ours", "ours", (), "Ours (GCN)"),
    Method("ours-1gnn", "ours", ("--backbone", "1gnn"), "Ours (1-GNN)"),
    Method("centralized", "centralized", (), "Centralized GCN"),
    Method("centralized-1gnn", "centralized", ("--backbone", "1gnn"), "Centralized 1-GNN"),
    Method("graphsage", "graphsage", (), "GraphSAGE"),
    Method("graphsaint", "graphsaint", (), "GraphSAINT"),
    Method("fedavg", "fedavg", (), "FedAvg+GCN"),
    Method("fedavg-nc", "fedavg-nc", (), "FedAvg+NC (20%)"),
    Method("bns", "bns", (), "BNS-GCN"),
    Method("ours-full", "ours", ("--sampling", "none"), "ours-full (no sampling)"),
    Method("ours-star", "ours", ("--no-normalize",), "ours* (no 1/p normalisation)"),
)}
TABLE2_METHODS = ("ours", "ours-1gnn", "centralized", "centralized-1gnn", "graphsage",
                  "graphsaint", "fedavg", "fedavg-nc", "bns")
BIAS_METHODS = ("ours", "fedavg", "fedavg-nc")  # figures 3 and 4
OVERHEAD_METHODS = ("ours-full", "fedavg", "ours")  # table 4: full-batch (CAGNET's role), ...
ABLATION_METHODS = ("ours-full", "ours-star", "ours")


# -- one run ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One training run; ``key`` names its directory under REPORT_DIR/runs."""

    dataset: str
    method: str
    num_clients: int  # shards used; centralized methods read the same shards merged
    partition: str  # random | label-skew
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


# -- the study's configuration ------------------------------------------------------------------
@dataclass(frozen=True)
class StudyConfig:
    """Every knob of the plan, with the reason for its default (2-core machine, 90 min)."""

    datasets: tuple[str, ...]
    out: Path
    # Defaults = the paper's protocol at the size that fits 90 minutes on the 2-core VM
    # (measured: starting 9 ranks ~18 s, 33 ranks ~60 s; an 8-client epoch ~0.15 s on cora):
    # one seed; pass --seeds 0,1,2 on a bigger machine.
    seeds: tuple[int, ...] = (0,)  # Table 2 / Table 5 seeds (mean and std when > 1)
    epochs: int = 200  # Table 2 / 5 epochs (the paper's)
    dataset_epochs: tuple[tuple[str, int], ...] = ()  # per-dataset override of ``epochs``
    # GraphSAGE and GraphSAINT take many mini-batch steps per epoch (ceil(n_train / 512) on
    # amazon-computers = 17): they get the epochs that give them about as many optimizer steps
    # as the full-batch methods take in ``epochs`` (see ``equal_step_epochs``), but at least
    # ``min_minibatch_epochs`` passes over the data: at 12 epochs (204 steps) GraphSAGE reached
    # 77.8% on amazon-computers, at 40 epochs 91.9%.
    equal_steps: bool = True
    min_minibatch_epochs: int = 40
    figure_datasets: tuple[str, ...] = ("cora",)  # figures 3-6 and table 4: smallest graph
    figure_seeds: tuple[int, ...] = (0,)
    figure_epochs: int = 200  # = epochs: the 8-client runs are shared with Table 2
    client_counts: tuple[int, ...] = (4, 8, 16, 32)  # figure 3 (the paper's)
    main_clients: int = 8  # Table 2: the paper's 8 clients
    overhead_clients: tuple[int, ...] = (4, 8)  # table 4 (the paper's)
    ablation_datasets: tuple[str, ...] = ("cora",)  # table 5; empty: all --datasets
    step_lengths: tuple[int, ...] = (1, 2, 4, 8)  # figure 5: steps per epoch
    fig5_nodes_fraction: float = 1.0  # figure 5: nodes drawn per epoch, as a fraction of n
    fig5_epochs: int = 5  # figure 5: the paper averages 10 epochs; 5 suffice for a mean
    only: tuple[str, ...] = SECTIONS
    lr: float = 0.01  # fixed lr when --lr-search is off (the paper's middle value)
    lr_search: bool = False
    data_root: str | None = None
    timeout: float = 900.0  # per run
    budget_minutes: float = 0.0  # > 0: launch no run that would end after this (0: no limit)
    retry_failed: bool = False
    dry_run: bool = False

    @classmethod
    def quick(cls, **values) -> "StudyConfig":
        """Minutes-scale smoke version: one seed, 2 epochs, 2-3 clients."""
        base = dict(seeds=(0,), epochs=2, figure_seeds=(0,), figure_epochs=2, dataset_epochs=(),
                    client_counts=(2, 3), main_clients=2, overhead_clients=(2,),
                    step_lengths=(1, 2), fig5_epochs=2, timeout=120.0)
        base.update(values)
        if "datasets" in values and "figure_datasets" not in values:
            base["figure_datasets"] = tuple(values["datasets"][:1])
        return cls(**base)

    def epochs_for(self, dataset: str) -> int:
        """Table 2 / 5 epochs of ``dataset`` (per-dataset override, else --epochs)."""
        return dict(self.dataset_epochs).get(dataset, self.epochs)

    def validate(self) -> None:
        if not self.datasets:
            raise ValueError("--datasets is empty, expected a comma-separated list")
        unknown = [s for s in self.only if s not in SECTIONS]
        if unknown:
            raise ValueError(f"--only {','.join(unknown)}: unknown section(s), expected some of "
                             f"{','.join(SECTIONS)}")
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise ValueError(f"--seeds {self.seeds}: expected non-negative integers")
        if self.epochs < 1 or self.figure_epochs < 1:
            raise ValueError(f"--epochs {self.epochs}: expected an integer >= 1")
        if self.lr <= 0:
            raise ValueError(f"--lr {self.lr}: expected a positive number")


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
    if method == "graphsage":
        per_epoch = max(1, math.ceil(num_train / MINIBATCH_SIZE))
    elif method == "graphsaint":
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
                       lr_of(dataset, method), timeout=config.timeout, **extra)

    def with_bias(run: PlannedRun, section: str, epochs: int) -> None:
        """Attach the centralized reference (same seed) and two noise references: another seed
        (other initial weights and dropout), and another seed with the reference's initial
        weights (--init-seed: dropout streams differ only). Every distributed run shares its
        initial weights with its reference, so the second floor is the like-for-like one."""
        s = run.spec
        ref = plan.add(spec(s.dataset, "centralized", config.main_clients, s.seed, epochs),
                       section)
        noise_seed = s.seed + 1
        noise = plan.add(spec(s.dataset, "centralized", config.main_clients, noise_seed, epochs),
                         section)
        same_init = plan.add(spec(s.dataset, "centralized", config.main_clients, noise_seed,
                                  epochs, flags=("--init-seed", str(s.seed)),
                                  tag=f"init{s.seed}"), section)
        run.reference, run.noise_reference = ref.spec.key, noise.spec.key
        run.same_init_reference = same_init.spec.key
        if ref.noise_reference is None:
            ref.reference, ref.noise_reference = ref.spec.key, noise.spec.key
            ref.same_init_reference = same_init.spec.key

    sections = set(config.only)
    if "table2" in sections:
        for dataset in config.datasets:
            for method in TABLE2_METHODS:
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
                    for method in BIAS_METHODS:
                        with_bias(plan.add(spec(dataset, method, clients, seed, e), "fig3"),
                                  "fig3", e)
            if "fig4" in sections:
                for partition in ("random", "label-skew"):
                    for method in BIAS_METHODS:
                        run = plan.add(spec(dataset, method, config.main_clients, seed, e,
                                            partition), "fig4")
                        with_bias(run, "fig4", e)
            if "table4" in sections:
                for clients in config.overhead_clients:
                    for method in OVERHEAD_METHODS:
                        plan.add(spec(dataset, method, clients, seed, e), "table4")
            if "fig6" in sections:
                for method in ("ours", "ours-full"):
                    plan.add(spec(dataset, method, config.main_clients, seed, e), "fig6")
            if "fig5" in sections:
                per_epoch = max(len(config.step_lengths),
                                round(config.fig5_nodes_fraction * num_nodes(dataset)))
                for steps in config.step_lengths:
                    size = max(1, per_epoch // steps)
                    plan.add(spec(dataset, "ours", config.main_clients, seed, config.fig5_epochs,
                                  flags=("--steps-per-epoch", str(steps), "--sample-size",
                                         str(size)), tag=f"k{steps}"), "fig5")
    if "table5" in sections:
        ablation = [d for d in config.ablation_datasets if d in config.datasets]
        for dataset in ablation or config.datasets[:1]:
            for method in ABLATION_METHODS:
                for seed in config.seeds:
                    plan.add(spec(dataset, method, config.main_clients, seed,
                                  config.epochs_for(dataset)), "table5")
    return plan


def lr_search_plan(config: StudyConfig, num_nodes: Callable[[str], int] | None = None,
                   num_train: Callable[[str], int] | None = None) -> list[RunSpec]:
    """Seed seeds[0] of every Table 2 (and ablation) method at every lr of the grid."""
    methods = list(TABLE2_METHODS) if "table2" in config.only else []
    if "table5" in config.only:
        methods += [m for m in ABLATION_METHODS if m not in methods]
    return [RunSpec(d, m, config.main_clients, "random", config.seeds[0],
                    method_epochs(config, m, d, config.epochs_for(d), num_nodes, num_train), lr,
                    timeout=config.timeout)
            for d in config.datasets for m in methods for lr in LR_GRID]


# -- cost model (for the plan's ETA before any run has finished) ---------------------------------
# Measured on the idle 2-core VM, OMP_NUM_THREADS=1: launch cost (mpirun, importing torch in
# every rank -- 2.3 s of CPU each -- and shard loading) and seconds per epoch per 1,000 nodes
# (train + full-graph evaluation). The driver rescales it per method with every run measured.
STARTUP_SECONDS = {"single": 5.0, "per_rank": 1.5}
EPOCH_SECONDS_PER_KNODE = {"single": 0.02, "distributed": 0.05}


def estimate_seconds(spec: RunSpec, num_nodes: int) -> float:
    kind = "distributed" if spec.distributed else "single"
    startup = STARTUP_SECONDS["single"] + (STARTUP_SECONDS["per_rank"] * spec.ranks
                                           if spec.distributed else 0.0)
    steps = 1
    if "--steps-per-epoch" in spec.flags:
        steps = int(spec.flags[spec.flags.index("--steps-per-epoch") + 1])
    per_epoch = EPOCH_SECONDS_PER_KNODE[kind] * num_nodes / 1000 * (1 + 0.3 * (steps - 1))
    per_epoch *= 1 + 0.05 * max(0, spec.num_clients - 8) if spec.distributed else 1
    return startup + spec.epochs * per_epoch


# -- executing runs -----------------------------------------------------------------------------
def mpi_env() -> dict[str, str]:
    """Open MPI from the wheel, oversubscribed (more ranks than cores), one thread per rank."""
    env = dict(os.environ)
    env.update(PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    return env


def mpirun_path() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else (shutil.which("mpirun") or "mpirun")


def train_command(spec: RunSpec, shard_dir: Path, run_dir: Path) -> list[str]:
    method = METHODS[spec.method]
    command = [sys.executable, "-m", "mpifgl.train", "--algo", method.algo,
               "--shards", str(shard_dir), "--out", str(run_dir), "--seed", str(spec.seed),
               "--epochs", str(spec.epochs), "--lr", f"{spec.lr:g}", "--save-logits",
               *method.flags, *spec.flags]
    if spec.distributed:
        command = [mpirun_path(), "-n", str(spec.ranks), *command]
    return command


@dataclass
class RunOutcome:
    status: str  # done | failed | skipped | unavailable
    seconds: float = 0.0
    message: str = ""


def run_status(run_dir: Path) -> str:
    if (run_dir / "final.json").is_file():
        return "done"
    if (run_dir / "FAILED.json").is_file():
        return "failed"
    return "partial" if run_dir.exists() else "pending"


class Interrupted(Exception):
    pass


def execute(spec: RunSpec, shard_dir: Path, run_dir: Path) -> RunOutcome:
    """Run one training subprocess into ``run_dir`` (which must not exist), with its timeout.
    The process group is killed on timeout or interruption; failures go to FAILED.json."""
    run_dir.mkdir(parents=True)
    command = train_command(spec, shard_dir, run_dir)
    (run_dir / "command.txt").write_text(" ".join(command) + "\n")
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        env = mpi_env()
        if not spec.distributed:  # one process: let torch use every core
            env.pop("OMP_NUM_THREADS", None)
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env,
                                   start_new_session=True)
        try:
            returncode = process.wait(timeout=spec.timeout)
            reason = "" if returncode == 0 else f"exit status {returncode}"
        except subprocess.TimeoutExpired:
            _kill_group(process)
            returncode, reason = -1, f"timed out after {spec.timeout:.0f} s"
        except BaseException:
            _kill_group(process)
            raise
    seconds = time.perf_counter() - start
    if not reason and not (run_dir / "final.json").is_file():
        reason = "exited 0 without writing final.json"
    if reason:
        tail = (run_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
        message = f"{reason}: " + (" | ".join(tail) if tail else "(no stderr)")
        (run_dir / "FAILED.json").write_text(json.dumps(
            {"reason": reason, "returncode": returncode, "seconds": seconds,
             "stderr_tail": tail, "command": command}, indent=2) + "\n")
        return RunOutcome("failed", seconds, message)
    (run_dir / "driver.json").write_text(json.dumps({"wall_seconds": seconds,
                                                     "command": command}, indent=2) + "\n")
    return RunOutcome("done", seconds)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def check_algorithms(algos: Iterable[str]) -> dict[str, str]:
    """``algo -> error`` for every algorithm whose trainer does not import. Checked in one
    subprocess, so a broken baseline cannot break the study (and torch is not imported here)."""
    code = ("import json, sys\n"
            "from mpifgl.algorithms import get_algorithm\n"
            "errors = {}\n"
            "for algo in sys.argv[1:]:\n"
            "    try:\n"
            "        get_algorithm(algo).trainer_class()\n"
            "    except Exception as exc:\n"
            "        errors[algo] = f'{type(exc).__name__}: {exc}'\n"
            "print(json.dumps(errors))\n")
    names = sorted(set(algos))
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                            env=mpi_env(), timeout=300)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        error = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {name: f"import check failed: {error}" for name in names}


PREPARE_CODE = """import json, sys
from data_prep.api import prepare_shards
dataset, clients, partition, root, out = sys.argv[1:]
try:
    manifest = prepare_shards(dataset, int(clients), partition, 0, root or None, out,
                              show_progress=False)
except (ValueError, OSError) as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(1)
print(json.dumps({"num_nodes": manifest["num_nodes"], "num_train": manifest["num_train"]}))
"""


def prepare_shards_subprocess(dataset: str, num_clients: int, partition: str,
                              data_root: str | None, out: Path) -> dict:
    """``data_prep.api.prepare_shards`` (partition seed 0) in a subprocess: the dataset loaders
    (torch, PyG) stay out of the driver. Raises ValueError with data_prep's message."""
    result = subprocess.run([sys.executable, "-c", PREPARE_CODE, dataset, str(num_clients),
                             partition, data_root or "", str(out)], capture_output=True,
                            text=True, env=mpi_env(), timeout=1800)
    lines = result.stdout.strip().splitlines()
    try:
        payload = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"preparing {out} failed: {tail}") from None
    if "error" in payload:
        raise ValueError(payload["error"])
    return payload


# -- the driver ---------------------------------------------------------------------------------
class Study:
    def __init__(self, config: StudyConfig):
        self.config = config
        self.root = Path(config.out)
        self.runs_dir = self.root / "runs"
        self.shards_dir = self.root / "shards"
        self.unavailable: dict[str, str] = {}
        self.manifests: dict[str, dict] = {}
        self.executed: dict[str, list[float]] = {}  # method -> [measured s, estimated s]
        self.start = time.perf_counter()

    # shards
    def shard_dir(self, spec: RunSpec) -> Path:
        path = self.shards_dir / spec.shard_name
        if spec.shard_name not in self.manifests:
            log.info("shards %s (prepared once, then reused)", path)
            self.manifests[spec.shard_name] = prepare_shards_subprocess(
                spec.dataset, spec.num_clients, spec.partition, self.config.data_root, path)
        return path

    def num_nodes(self, dataset: str) -> int:
        return self._dataset_size(dataset, "num_nodes", KNOWN_NUM_NODES, 10000)

    def num_train(self, dataset: str) -> int:
        return self._dataset_size(dataset, "num_train", KNOWN_NUM_TRAIN, 5000)

    def _dataset_size(self, dataset: str, key: str, known: dict[str, int], fallback: int) -> int:
        """``key`` of the dataset's main shards' manifest (preparing them if needed)."""
        manifest = self.shards_dir / f"{dataset}-random-m{self.config.main_clients}-s0" / \
            "manifest.json"
        if manifest.is_file():
            return int(json.loads(manifest.read_text())[key])
        if self.config.dry_run and dataset in known:
            return known[dataset]
        spec = RunSpec(dataset, "centralized", self.config.main_clients, "random", 0, 1, 0.01)
        try:
            self.shard_dir(spec)
        except ValueError:
            return known.get(dataset, fallback)  # the runs will record the failure
        return int(self.manifests[spec.shard_name][key])

    # one batch of runs
    def run_all(self, specs: list[RunSpec], label: str,
                outcomes: dict[str, RunOutcome] | None = None) -> dict[str, RunOutcome]:
        """Run ``specs``, recording each outcome in ``outcomes`` as it comes (so an interrupted
        study still knows what it did)."""
        outcomes = {} if outcomes is None else outcomes
        estimates = {s.key: estimate_seconds(s, self.num_nodes(s.dataset)) for s in specs}
        remaining = sum(estimates.values())
        log.info("%s: %d runs, estimated %s of compute (cost model)", label, len(specs),
                 _hms(remaining))
        pending = list(specs)
        for i in range(1, len(specs) + 1):
            # Cheapest next, by the cost model rescaled with every run measured so far (per
            # method): an overrun of the budget then costs the few most expensive runs.
            spec = min(pending, key=lambda s: estimates[s.key] * self.cost_scale(s.method))
            pending.remove(spec)
            run_dir = self.runs_dir / spec.key
            status = run_status(run_dir)
            method = METHODS[spec.method]
            if method.algo in self.unavailable:
                outcomes[spec.key] = RunOutcome("unavailable", 0.0, self.unavailable[method.algo])
                continue
            if status == "done":  # calibrate the cost model with runs of earlier sessions
                wall = (read_json(run_dir / "driver.json") or {}).get("wall_seconds")
                if wall:
                    measured = self.executed.setdefault(spec.method, [0.0, 0.0])
                    measured[0] += float(wall)
                    measured[1] += estimates[spec.key]
            if status == "done" or (status == "failed" and not self.config.retry_failed):
                outcomes[spec.key] = RunOutcome("skipped" if status == "done" else "failed",
                                                message="already " + status)
                log.info("run %d/%d %s: %s, skipped", i, len(specs), spec.key, "already " + status)
                continue
            elapsed = time.perf_counter() - self.start
            expected = estimates[spec.key] * self.cost_scale(spec.method)
            if (self.config.budget_minutes > 0 and not self.config.dry_run
                    and elapsed + expected > self.config.budget_minutes * 60):
                outcomes[spec.key] = RunOutcome("budget", 0.0, "not run: over the time budget")
                log.info("run %d/%d %s: not run (would end after the %.0f-min budget: elapsed "
                         "%s + ~%.0f s)", i, len(specs), spec.key, self.config.budget_minutes,
                         _hms(elapsed), expected)
                continue
            if self.config.dry_run:
                log.info("run %d/%d %s (%d ranks, ~%.0f s)", i, len(specs), spec.key, spec.ranks,
                         estimates[spec.key])
                continue
            if run_dir.exists():  # half-done (interrupted) or a failure being retried
                log.info("run %d/%d %s: removing the half-done run directory", i, len(specs),
                         spec.key)
                shutil.rmtree(run_dir)
            try:
                shard_dir = self.shard_dir(spec)
            except (ValueError, OSError) as exc:
                outcomes[spec.key] = RunOutcome("failed", 0.0, f"data_prep: {exc}")
                log.warning("run %d/%d %s: FAILED preparing shards: %s", i, len(specs),
                            spec.key, exc)
                continue
            if self.config.budget_minutes > 0:  # no run may outlive the budget
                left = self.config.budget_minutes * 60 - (time.perf_counter() - self.start)
                spec = replace(spec, timeout=max(1.0, min(spec.timeout, left)))
            log.info("run %d/%d %s (%d ranks) ...", i, len(specs), spec.key, spec.ranks)
            try:
                outcome = execute(spec, shard_dir, run_dir)
            except BaseException:
                if not (run_dir / "final.json").is_file():  # final.json is written last
                    shutil.rmtree(run_dir, ignore_errors=True)  # never leave a half-done run
                raise
            outcomes[spec.key] = outcome
            measured = self.executed.setdefault(spec.method, [0.0, 0.0])
            measured[0] += outcome.seconds
            measured[1] += estimates[spec.key]
            elapsed = time.perf_counter() - self.start
            eta = sum(estimates[s.key] * self.cost_scale(s.method) for s in pending)
            result = (f"test F1 {_final_f1(run_dir):.4f}" if outcome.status == "done"
                      else f"FAILED: {outcome.message[:300]}")
            log.info("run %d/%d %s: %s in %.1f s | elapsed %s, ETA %s", i, len(specs), spec.key,
                     result, outcome.seconds, _hms(elapsed), _hms(eta))
        return outcomes

    def cost_scale(self, method: str) -> float:
        """Measured / estimated seconds of the runs executed so far: of the same method when
        one ran (GraphSAGE's mini-batches cost far more than the model expects), else of all."""
        seconds, estimate = self.executed.get(method, (0.0, 0.0))
        if estimate <= 0:
            seconds = sum(v[0] for v in self.executed.values())
            estimate = sum(v[1] for v in self.executed.values())
        return seconds / estimate if estimate > 0 else 1.0

    def search_lrs(self) -> dict[str, float]:
        """Best-val lr per (dataset, method) on seed seeds[0]."""
        specs = lr_search_plan(self.config, self.num_nodes, self.num_train)
        self.run_all(specs, "lr search")
        choice: dict[str, tuple[float, float]] = {}
        for spec in specs:
            final = self.runs_dir / spec.key / "final.json"
            if not final.is_file():
                continue
            val = json.loads(final.read_text()).get("best_val_micro_f1", -1.0)
            name = f"{spec.dataset}/{spec.method}"
            if name not in choice or val > choice[name][1]:
                choice[name] = (spec.lr, val)
        return {name: lr for name, (lr, _) in choice.items()}

    def run(self) -> Plan:
        config = self.config
        self.root.mkdir(parents=True, exist_ok=True)
        algos = {m.algo for m in METHODS.values()}
        self.unavailable = {} if config.dry_run else check_algorithms(algos)
        for algo, error in self.unavailable.items():
            log.warning("--algo %s does not import (%s): its runs are recorded as unavailable",
                        algo, error)
        lr_choice = self.search_lrs() if config.lr_search and not config.dry_run else {}
        plan = build_plan(config, lambda d, m: lr_choice.get(f"{d}/{m}", config.lr),
                          self.num_nodes, self.num_train)
        plan.lr_choice = lr_choice
        self.write_plan(plan, {})
        # Cheapest first (cost model): an overrun of the budget then costs the few most
        # expensive runs (33-rank or large-dataset runs), not whole sections.
        specs = sorted((p.spec for p in plan.runs.values()),
                       key=lambda s: estimate_seconds(s, self.num_nodes(s.dataset)))
        outcomes: dict[str, RunOutcome] = {}
        try:
            self.run_all(specs, "study", outcomes)
        finally:  # interrupted sessions count in the study's measured wall time too
            self.write_plan(plan, outcomes, record_session=not config.dry_run)
        return plan

    def write_plan(self, plan: Plan, outcomes: dict[str, RunOutcome],
                   record_session: bool = False) -> None:
        payload = plan.to_json()
        payload["config"] = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(
            v, Path) else v) for k, v in asdict(self.config).items()}
        payload["unavailable"] = self.unavailable
        payload["estimated_seconds"] = sum(
            estimate_seconds(p.spec, self.num_nodes(p.spec.dataset)) for p in plan.runs.values())
        previous = self.root / "plan.json"
        history = []
        if previous.is_file():
            try:
                history = json.loads(previous.read_text()).get("sessions", [])
            except ValueError:
                history = []
        if record_session:
            history = history + [{"wall_seconds": time.perf_counter() - self.start,
                                  "executed": sum(o.status in ("done", "failed")
                                                  and o.message != "already failed"
                                                  for o in outcomes.values()),
                                  "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}]
        payload["sessions"] = history
        payload["outcomes"] = {k: asdict(o) for k, o in outcomes.items()}
        tmp = previous.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, previous)


def _final_f1(run_dir: Path) -> float:
    return float((read_json(run_dir / "final.json") or {}).get("test_micro_f1", float("nan")))


def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# -- command line -------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def parse_config(argv: list[str] | None) -> StudyConfig:
    parser = argparse.ArgumentParser(prog="python -m mpifgl.experiments",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=_names, required=True)
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--seeds", type=_ints, default=None,
                        help="Table 2/5 seeds (default 0: the 90-minute plan; e.g. 0,1,2)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs of Table 2/5 runs (default 200, the paper's; quick: 2)")
    parser.add_argument("--figure-epochs", type=int, default=None,
                        help="epochs of the figure runs (default 200; quick: 2)")
    parser.add_argument("--figure-datasets", type=_names, default=None,
                        help="datasets of figures 3-6 and table 4 (default: cora, else the "
                             "first of --datasets)")
    parser.add_argument("--ablation-datasets", type=_names, default=None,
                        help="datasets of table 5 (default: cora)")
    parser.add_argument("--clients", type=_ints, default=None,
                        help="figure 3 client counts (default 4,8,16,32, the paper's)")
    parser.add_argument("--same-epochs", action="store_true",
                        help="run GraphSAGE and GraphSAINT for --epochs epochs too (default: "
                             "the epochs that give them about --epochs optimizer steps)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 seed, 2 epochs, 2-3 clients")
    parser.add_argument("--only", type=_names, default=SECTIONS,
                        help=f"sections to run, some of {','.join(SECTIONS)}")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--lr", type=float, default=0.01, help="fixed lr without --lr-search")
    parser.add_argument("--lr-search", action="store_true",
                        help="pick lr in {0.1, 0.01, 0.001} per dataset and method on seed "
                             "seeds[0] by best validation micro-F1")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run (900)")
    parser.add_argument("--budget-minutes", type=float, default=0.0,
                        help="launch no run that the cost model (scaled by the runs measured so "
                             "far) expects to end after this many minutes; such runs are "
                             "reported as 'budget' and run on the next invocation")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run again the runs recorded as failed")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and its estimated duration, run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from the runs present, run nothing")
    args = parser.parse_args(argv)
    values = {"datasets": args.datasets, "out": args.out, "only": args.only, "lr": args.lr,
              "lr_search": args.lr_search, "data_root": args.data_root,
              "retry_failed": args.retry_failed, "dry_run": args.dry_run,
              "budget_minutes": args.budget_minutes, "equal_steps": not args.same_epochs}
    optional = {"seeds": args.seeds, "epochs": args.epochs, "figure_epochs": args.figure_epochs,
                "figure_datasets": args.figure_datasets, "client_counts": args.clients,
                "ablation_datasets": args.ablation_datasets, "timeout": args.timeout}
    values.update({k: v for k, v in optional.items() if v is not None})
    if args.seeds is not None and "figure_seeds" not in values:
        values["figure_seeds"] = args.seeds[:1]
    if args.epochs is not None:
        values["dataset_epochs"] = ()  # an explicit --epochs applies to every dataset
    config = StudyConfig.quick(**values) if args.quick else StudyConfig(**values)
    if args.figure_datasets is None and not args.quick:
        config = replace(config, figure_datasets=("cora",) if "cora" in config.datasets
                         else config.datasets[:1])
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return replace(config, dry_run=config.dry_run or False), args.report_only  # type: ignore


def main(argv: list[str] | None = None) -> int:
    config, report_only = parse_config(argv)
    logging.basicConfig(level=logging.INFO, format="[study %(asctime)s] %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stdout)
    study = Study(config)
    try:
        if not report_only:
            study.run()
    except KeyboardInterrupt:
        log.warning("interrupted: finished runs are kept; run the same command again to resume")
        return 130
    if config.dry_run:
        payload = json.loads((Path(config.out) / "plan.json").read_text())
        log.info("plan: %d runs, estimated %s (cost model; see plan.json)",
                 len(payload["runs"]), _hms(payload["estimated_seconds"]))
        return 0
    path = write_report(Path(config.out))
    log.info("report written: %s", path)
    return 0


def _sigterm(signum, frame):  # SIGTERM (e.g. SLURM preemption) behaves like Ctrl-C
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    sys.exit(main())
