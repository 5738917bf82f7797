"""The study's driver: prepares the shards, launches every run of the plan as a subprocess with a
timeout, resumes, and keeps the budget.

 1. checks which ``--algo`` values import (``python -m study.check_algorithms``: a method that
    does not import is recorded as unavailable, not run);
 2. prepares the shards it needs (``python -m study.prepare_shards``, reused when present);
 3. runs every run (``mpirun -n M+1 python -m mpifgl.train`` for distributed algorithms, one
    process otherwise) with a timeout, logging ``run i/N ... elapsed, ETA``; a run whose
    ``final.json`` exists is skipped, a half-done run directory is removed and redone, a failure
    is recorded in the run directory's ``FAILED.json`` and the study goes on
    (``--retry-failed`` runs those again);
 4. writes ``plan.json`` as it goes (``study.report`` reads it).

It launches subprocesses only: it never imports mpi4py (nor torch).

Learning rate: the default is one fixed lr (the paper's middle value) for every method, because
the search triples the cost of the main table. ``--lr-search`` runs seed ``seeds[0]`` of every
(dataset, method) of Table 2 at every lr of ``LR_GRID``, picks the best validation micro-F1 and
runs all seeds (and every other section using that method and dataset) at that lr.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable

from fgl_common.child_session import run_in_session
from fgl_common.launch import mpi_launch_env, mpirun_path
from study.catalog import METHODS, REFERENCE_METHOD
from study.config import StudyConfig
from study.plan import (KNOWN_NUM_NODES, KNOWN_NUM_TRAIN, Plan, RunSpec, build_plan,
                        estimate_seconds, lr_search_plan)
from study.rundir import read_json, run_status

log = logging.getLogger("study")
REPO = Path(__file__).resolve().parents[1]


# -- executing runs -----------------------------------------------------------------------------
def subprocess_env(one_thread_per_rank: bool = True) -> dict[str, str]:
    """The MPI launch environment, with this checkout first on PYTHONPATH (the subprocesses
    import the same code as the driver). Without ``one_thread_per_rank`` (a one-process run)
    OMP_NUM_THREADS is left out, so torch uses every core."""
    env = mpi_launch_env(one_thread_per_rank=one_thread_per_rank)
    if not one_thread_per_rank:
        env.pop("OMP_NUM_THREADS", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


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


def execute(spec: RunSpec, shard_dir: Path, run_dir: Path) -> RunOutcome:
    """Run one training subprocess into ``run_dir`` (which must not exist), with its timeout.
    Every process of its session (mpirun and its ranks) is ended on timeout or interruption;
    failures go to FAILED.json."""
    run_dir.mkdir(parents=True)
    command = train_command(spec, shard_dir, run_dir)
    (run_dir / "command.txt").write_text(" ".join(command) + "\n")
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        finished = run_in_session(command, spec.timeout, stdout=out, stderr=err,
                                  env=subprocess_env(one_thread_per_rank=spec.distributed))
    returncode = -1 if finished.timed_out else finished.returncode
    if finished.timed_out:
        reason = f"timed out after {spec.timeout:.0f} s"
    else:
        reason = "" if returncode == 0 else f"exit status {returncode}"
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


def check_algorithms(algos: Iterable[str]) -> dict[str, str]:
    """``algo -> error`` for every algorithm whose trainer does not import. Checked in one
    subprocess (``study.check_algorithms``), so a broken baseline cannot break the study (and
    torch is not imported here)."""
    names = sorted(set(algos))
    result = subprocess.run([sys.executable, "-m", "study.check_algorithms", *names],
                            capture_output=True, text=True, env=subprocess_env(), timeout=300)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        error = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {name: f"import check failed: {error}" for name in names}


def prepare_shards_subprocess(dataset: str, num_clients: int, partition: str,
                              data_root: str | None, out: Path) -> dict:
    """``data_prep.api.prepare_shards`` (partition seed 0) in a subprocess
    (``study.prepare_shards``): the dataset loaders (torch, PyG) stay out of the driver. Raises
    ValueError with data_prep's message."""
    command = [sys.executable, "-m", "study.prepare_shards", "--dataset", dataset,
               "--num-clients", str(num_clients), "--partition", partition, "--out", str(out)]
    if data_root:
        command += ["--data-root", data_root]
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(),
                            timeout=1800)
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
        spec = RunSpec(dataset, REFERENCE_METHOD, self.config.main_clients, "random", 0, 1, 0.01)
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
                 hms(remaining))
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
                         hms(elapsed), expected)
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
                     result, outcome.seconds, hms(elapsed), hms(eta))
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


def failed_runs(root: Path) -> dict[str, str]:
    """``key -> reason`` of every planned run of the study in ``root`` that failed (its
    FAILED.json; shards that could not be prepared) or could not run (its method does not
    import), as plan.json and the run directories record them."""
    plan = read_json(root / "plan.json") or {}
    failed = {}
    unavailable = plan.get("unavailable", {})
    for entry in plan.get("runs", []):
        run_dir = root / "runs" / entry["key"]
        record = read_json(run_dir / "FAILED.json")
        algo = METHODS[entry["method"]].algo if entry.get("method") in METHODS else None
        if record is not None:
            failed[entry["key"]] = str(record.get("reason", "failed"))
        elif algo in unavailable and run_status(run_dir) != "done":
            failed[entry["key"]] = f"unavailable: --algo {algo} does not import"
    for key, outcome in plan.get("outcomes", {}).items():
        if outcome.get("status") in ("failed", "unavailable") and key not in failed:
            failed[key] = f"{outcome['status']}: {outcome.get('message', '')}".rstrip(": ")
    return failed


def _final_f1(run_dir: Path) -> float:
    return float((read_json(run_dir / "final.json") or {}).get("test_micro_f1", float("nan")))


def hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


