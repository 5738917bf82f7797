"""Entry point: ``mpirun -n M+1 python -m mpifgl.train --shards DIR --out RUN_DIR``.

It only sequences the run: parse and validate the config, resolve the shards (preparing the
default dataset's if none are given), check every input on every rank before the first training
collective, take the run directory, build the rank's graph, train, write outputs.

Failures (mpifgl.failures, docs/reliability.md): set-up findings and non-finite values in
training (mpifgl.finite) are agreed on by every rank and reported once by rank 0; any other
exception on any rank, from MPI start to the last write, is printed by that rank as one line
(``--verbose``: with the traceback) and aborts the whole job. Every report says what is kept and
how to go on (``--resume``, or the command that starts the run again), shell-quoted.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fgl_common.cli import dataclass_from_namespace, explicit_dests
from fgl_common.shard_format import (MANIFEST_NAME, ShardError, check_shard_against_manifest,
                                     default_shard_dir, describe_non_finite, file_sha256,
                                     load_client_shard, non_finite_rows, read_manifest,
                                     shard_filename)
from fgl_common.shard_identity import describe as describe_shards
from fgl_common.shard_identity import describe_graph, fingerprint, graph_fingerprint
from mpifgl.communicator import Communicator, LocalComm
from mpifgl.config import (TrainConfig, build_parser, parse_watchdog_seconds, resolved_path,
                           restart_command, resumed_config, resumes_in_place)
from mpifgl.failures import (AgreedFailure, Interrupted, SetupError, agree, describe,
                             describe_stall, exit_status, host_of, install_signal_handlers,
                             rank_label, signals_ignored)
from mpifgl.finite import NonFiniteError
from mpifgl.graph import ClientGraph
from mpifgl import hardware
from mpifgl.methods import build_trainer, get_method
from mpifgl.runlog import (CHECKPOINT_NAME, RunDirectory, claim_run_dir, default_run_dir,
                           load_checkpoint, new_run_id)
from mpifgl.sampling import community_sampler_note, default_sample_size
from mpifgl.trainer import Trainer
from mpifgl.watchdog import Stall, timeout_seconds

log = logging.getLogger("mpifgl")
PROG = "mpifgl.train"
USAGE_ERROR, INPUT_ERROR = 2, 1
# seconds per rank before a rank reports a failure that may have struck every rank alike (a
# signal, a set-up error of the same input): the lowest such rank reports, its abort ends the rest
REPORT_STAGGER = 1.0
MAX_STAGGERED_RANKS = 8  # ranks above wait as long as this one: a report comes within seconds


@dataclass
class RankProgress:
    """How far this rank got: what a failure report says besides the error itself."""

    config: TrainConfig
    phase: str = "during set-up"
    trainer: Trainer | None = None
    run_dir: RunDirectory | None = None
    started: float = field(default_factory=time.perf_counter)  # the run's wall clock

    def where(self) -> str:
        if self.trainer is None:
            return self.phase
        return self.trainer.position or "while writing the final outputs"

    def leave_run_dir(self) -> None:
        """A failed run gives up its directory: a run that never started leaves none, one that
        did keeps its files and releases its lock."""
        if self.run_dir is None:
            return
        if self.trainer is None:
            self.run_dir.abandon()
        else:
            self.run_dir.release()

    def kept(self, size: int, repeatable: bool = True) -> str:
        """What a run that started training keeps, and how to go on: ``--resume`` from its
        last checkpoint, or (none yet) the command that starts it again. ``repeatable``
        False: running the same steps again would fail again (a non-finite value), so no
        command is offered."""
        if self.trainer is None or not self.trainer.config.out:
            return ""
        config = self.trainer.config
        out = shlex.quote(config.out)
        launch = f"mpirun -n {size} " if size > 1 else ""
        saved = self.trainer.checkpoint_epoch
        has_checkpoint = saved and (Path(config.out) / CHECKPOINT_NAME).is_file()
        if not repeatable:
            held = f", its checkpoint of epoch {saved} too" if has_checkpoint else ""
            return (f"; files kept in {out}{held}; the same settings repeat the same steps: "
                    f"remove the cause (the data, or e.g. a lower --lr) and start again")
        if has_checkpoint:
            return (f"; files kept in {out}; continue from its checkpoint of epoch {saved} "
                    f"with: {launch}python -m {PROG} --resume {out}")
        if config.resume and not resumes_in_place(config):
            again = (f"{launch}python -m {PROG} --resume {shlex.quote(config.resume)} "
                     f"--out {out} --force")
        else:  # the settings as given, before the method resolved its defaults
            again = restart_command(self.config, size, config.out)
        why = (f"no checkpoint yet (the first is written after epoch {config.checkpoint_every})"
               if config.checkpoint_every else "no checkpoint (--checkpoint-every K writes one)")
        return f"; files kept in {out}, {why}; start again with: {again}"


def setup_logging(role: str, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stdout if verbose else sys.stderr)
    handler.setFormatter(logging.Formatter(f"[{role}] %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


def launcher_world_size() -> int:
    """World size announced by mpirun/srun, read without initialising MPI."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def launcher_rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def parse_args(argv: list[str] | None, quiet: bool) -> TrainConfig:
    parser = build_parser()
    if quiet:  # only rank 0 prints usage errors
        parser.print_usage = lambda *a, **k: None  # type: ignore[method-assign]
        parser._print_message = lambda *a, **k: None  # type: ignore[method-assign]
    config = dataclass_from_namespace(TrainConfig, parser.parse_args(argv))
    explicit = explicit_dests(parser, argv if argv is not None else sys.argv[1:])
    try:  # checked as the method runs it: its defaults for the flags not given
        method_defaults = get_method(config.algo).default_changes(explicit, config.layers)
        config.replace(**method_defaults).validate()
    except ValueError as exc:
        if not quiet:
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    return config


def prepare_default_shards(config: TrainConfig, shard_dir: Path, num_clients: int) -> None:
    """Run ``python -m data_prep`` for the default run's shards: data preparation is a program
    of its own, which training never imports. Shards another job installed meanwhile (it won
    the race for the same directory) count as prepared; read_manifest and the checksums check
    them like any others."""
    log.warning("no --shards given: preparing %s with %d clients in %s (once)", config.dataset,
                num_clients, shard_dir)
    command = [sys.executable, "-m", "data_prep", "--dataset", config.dataset,
               "--num-clients", str(num_clients), "--partition", "random", "--seed", "0",
               "--out", str(shard_dir), "--quiet"]
    if config.data_root:
        command += ["--data-root", config.data_root]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0 or (shard_dir / MANIFEST_NAME).is_file():
        return
    error = done.stderr.strip()
    marker = "data_prep: error: "
    reason = error[error.rindex(marker) + len(marker):] if marker in error else \
        (error.splitlines() or [f"exit status {done.returncode}"])[-1]
    raise ValueError(f"preparing the default shards in {shard_dir} failed: {reason}")


def resolve_shards(config: TrainConfig, comm: Communicator, num_clients: int) -> TrainConfig:
    """The shard directory every rank will read; the server prepares the default one if needed."""
    if config.shards:
        return config
    shard_dir = default_shard_dir(config.dataset, num_clients)

    def prepare() -> None:
        try:
            if comm.is_server and not (shard_dir / MANIFEST_NAME).is_file():
                prepare_default_shards(config, shard_dir, num_clients)
        finally:  # clients sleep in this barrier while the server prepares, failing or not
            comm.wait_for_server()
    agree(comm, prepare, server_only=True)
    return config.replace(shards=str(shard_dir))


def load_rank_graph(config: TrainConfig, comm: Communicator, manifest) -> ClientGraph:
    """One process: every shard, merged. MPI: the server gets an empty graph (it opens no shard);
    a client loads and checks its own."""
    sizes = manifest.client_sizes()
    if comm.is_single_process:
        shards = [load_checked_shard(config, manifest, i) for i in range(manifest.num_clients)]
        return ClientGraph.merged(shards)
    if not comm.is_client:
        return ClientGraph.empty(sizes, manifest.num_features)
    return ClientGraph.from_shard(load_checked_shard(config, manifest, comm.client_id), sizes)


def load_whole_graph(config: TrainConfig, comm: Communicator, manifest) -> ClientGraph | None:
    """Every shard, merged, on the server of a method whose server holds the whole graph
    (the registry's ``server_loads_graph``: LLCG); None on every other rank and method."""
    if comm.is_single_process or not comm.is_server or \
            not get_method(config.algo).server_loads_graph:
        return None
    return ClientGraph.merged([load_checked_shard(config, manifest, i)
                               for i in range(manifest.num_clients)])


def load_checked_shard(config: TrainConfig, manifest, client_id: int):
    path = Path(config.shards) / shard_filename(client_id)
    if not path.is_file():
        raise ShardError(f"{path}: shard file missing (manifest lists {manifest.num_clients} "
                         f"clients)")
    expected = manifest.clients[client_id]["sha256"]
    found = file_sha256(path)
    if found != expected:
        raise ShardError(f"{path}: sha256 {found[:16]}... does not match the manifest's "
                         f"{expected[:16]}...; the file is corrupted or from another run")
    shard = load_client_shard(path)
    check_shard_against_manifest(shard, manifest, client_id, path)
    non_finite = non_finite_rows(shard.x)
    if non_finite is not None:  # training on it would report NaN as a result
        raise ShardError(f"{path}: /nodes/x holds non-finite values: "
                         f"{describe_non_finite(non_finite, 'row', shard.global_id)}; re-make "
                         f"the shards with `python -m data_prep` from finite features")
    return shard


def check_world_size(comm: Communicator, manifest, shards: str) -> None:
    if not comm.is_single_process and comm.num_clients != manifest.num_clients:
        raise SetupError(f"world size {comm.size} != 1 server + {manifest.num_clients} clients "
                         f"(manifest {Path(shards) / 'manifest.json'}); launch with "
                         f"mpirun -n {manifest.num_clients + 1}")


def check_sample_size(config: TrainConfig, manifest) -> None:
    """A sample of more draws than the graph has nodes is a mistake, not a bigger sample."""
    n = manifest.num_nodes
    if config.sample_size > n:
        raise SetupError(f"--sample-size is {config.sample_size}, expected at most {n} (the "
                         f"nodes of the shards in {config.shards}), or 0 for the default by the "
                         f"graph's size ({default_sample_size(n, config.backbone)})")


def check_same_shards(checkpoint: dict, manifest, config: TrainConfig) -> None:
    """--resume continues on the shards its checkpoint was trained on, never on others: at the
    path it recorded, or moved to another (``--resume X --shards NEW``)."""
    saved = checkpoint.get("shards_fingerprint")
    recorded = checkpoint["config"].get("shards")
    if saved is None:  # written before checkpoints named their shards
        if recorded and resolved_path(recorded) != config.shards:
            raise SetupError(f"--resume {config.resume} --shards {config.shards}: the "
                             f"checkpoint does not record its shards' fingerprint (an older "
                             f"mpifgl.train), so other shards than its own {recorded} cannot "
                             f"be proven the same; put them back at {recorded}")
        log.warning("--resume %s: the checkpoint does not name its shards; not checked",
                    config.resume)
        return
    now = fingerprint(manifest.raw)
    if saved != now:
        raise SetupError(
            f"--resume {config.resume}: its checkpoint was trained on other shards (fingerprint "
            f"{saved}: {checkpoint.get('shards_description')}) than {config.shards} holds now "
            f"(fingerprint {now}: {describe_shards(manifest.raw)}); they were re-made or "
            f"replaced: restore the shards it was trained on, or start a new run")


def open_resumed_run(config: TrainConfig, progress: RankProgress) -> dict:
    """The server's side of --resume X: X must hold a checkpoint (a run stopped before its
    first one is told how to start again) and, resumed in place, must not be finished. In place,
    X is claimed first (its lock taken, a killed run's temporary files removed)."""
    source = Path(os.path.abspath(config.resume))
    flag = f"--resume {shlex.quote(str(source))}"
    if not source.is_dir():
        raise SetupError(f"{flag}: no such run directory")
    if resumes_in_place(config):
        progress.run_dir = claim_run_dir(source, False, resume=True)
    if not (source / CHECKPOINT_NAME).is_file():
        saved = _saved_config(source)
        if saved is None:
            raise SetupError(f"{flag}: no {CHECKPOINT_NAME} and no config.json there; not a run "
                             f"directory of {PROG}")
        config_saved, world_size = saved
        why = (f"stopped before its first checkpoint (written after epoch "
               f"{config_saved.checkpoint_every})" if config_saved.checkpoint_every
               else "wrote no checkpoints (--checkpoint-every 0)")
        raise SetupError(f"{flag}: the run there {why}, so there is nothing to resume; start "
                         f"it again with: {restart_command(config_saved, world_size, str(source))}")
    if resumes_in_place(config) and (source / "final.json").is_file():
        raise SetupError(f"{flag}: the run there is finished (final.json); a resume never "
                         f"rewrites a finished run: to train it further, continue it into a new "
                         f"directory with {flag} --out NEW_DIR --epochs N")
    checkpoint = load_checkpoint(source)
    check_checkpoint_is_the_runs(checkpoint, source, flag)
    return checkpoint


def check_checkpoint_is_the_runs(checkpoint: dict, source: Path, flag: str) -> None:
    """The checkpoint of X belongs to the run of X (the run id its config.json records): one
    copied from another run directory would continue another run under this one's name."""
    own = _saved_run_id(source)
    found = checkpoint.get("run_id")
    if own is None or found is None:  # written before runs had an id
        if found is None:
            log.warning("%s: the checkpoint records no run id (an older mpifgl.train); its run "
                        "is not checked", flag)
        return
    if found != own:
        where = checkpoint.get("run_dir")
        raise SetupError(f"{flag}: {source / CHECKPOINT_NAME} belongs to another run (run id "
                         f"{found}, written in {where or 'an unrecorded directory'}) than the run "
                         f"of {source} (run id {own}, its config.json); a checkpoint copied "
                         f"from another run is not resumed: resume that run"
                         + (f" (--resume {shlex.quote(where)})" if where else ""))


def _saved_run_id(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "config.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def _saved_config(run_dir: Path) -> tuple[TrainConfig, int] | None:
    """A run directory's config.json as (config, world size); None if missing or unreadable."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())
        return TrainConfig.from_dict(saved), int(saved.get("world_size", 1))
    except (OSError, ValueError, TypeError):
        return None


def set_up(config: TrainConfig, comm: Communicator, progress: RankProgress,
           explicit: set[str] = frozenset()) -> tuple[Trainer, TrainConfig]:
    """Everything before the first training step. Every input check is an agreement point
    (``agree``): a finding on any rank raises the same SetupError on every rank."""
    checkpoint = None
    if config.resume:
        given = config
        checkpoint = agree(comm, lambda: open_resumed_run(given, progress) if comm.is_server
                           else None, server_only=True)
        saved, saved_epoch = comm.broadcast_object(
            (checkpoint["config"], checkpoint["epoch"]) if checkpoint else None)
        config = agree(comm, lambda: resumed_config(saved, given, explicit, saved_epoch))
    # one process prepares the default shards with the paper's 8 clients
    config = resolve_shards(config, comm,
                            8 if comm.is_single_process else max(1, comm.num_clients))

    def read_checked_manifest():
        try:
            manifest = read_manifest(config.shards)
        except ShardError as exc:
            if config.resume and "shards" not in explicit:
                raise ShardError(f"{exc}; if the shards were moved, give their new place with "
                                 f"--resume {config.resume} --shards NEW_PATH (their "
                                 f"fingerprint proves them the same)") from None
            raise
        check_world_size(comm, manifest, config.shards)
        check_sample_size(config, manifest)
        config.check_clients(manifest.num_clients, config.shards)
        if checkpoint is not None:
            if checkpoint.get("world_size") != comm.size:
                raise SetupError(f"--resume {config.resume}: checkpoint written with "
                                 f"{checkpoint.get('world_size')} ranks, this job has {comm.size}")
            check_same_shards(checkpoint, manifest, config)
        return manifest
    manifest = agree(comm, read_checked_manifest)
    # Recorded resolved: the dataset of the shards actually used, absolute paths (resume from
    # any working directory, bias reports read the shards from config.json).
    config = config.replace(dataset=manifest.dataset, shards=resolved_path(config.shards),
                            data_root=resolved_path(config.data_root))
    exclusive = comm.is_server and not config.out  # a default name must be a new directory
    if exclusive:
        config = config.replace(out=str(default_run_dir(manifest.dataset, config.algo)))
    if comm.is_server:
        config = config.replace(out=os.path.abspath(config.out))
    config = comm.broadcast_object(config)
    progress.config = config
    # the device and threads of every rank: a GPU asked for and missing stops every rank here
    placement = agree(comm, lambda: hardware.place(config.device, config.threads, comm))
    hardware.apply(placement)
    progress.phase = "while taking the run directory and loading the shards"

    def claim_and_load() -> tuple[ClientGraph, ClientGraph | None]:
        # The run directory is taken (lock) before anything is written, and before the last
        # agreement point, so a run directory that cannot be created stops every rank here
        # (a resume in place took it already).
        if comm.is_server and progress.run_dir is None:
            progress.run_dir = claim_run_dir(config.out, config.force, False, exclusive)
        return load_rank_graph(config, comm, manifest), load_whole_graph(config, comm, manifest)
    graph, whole_graph = agree(comm, claim_and_load)
    progress.phase = "during set-up"
    run_dir = progress.run_dir
    if run_dir is not None and run_dir.leftovers:
        log.warning("removed the temporary files of an interrupted run from %s: %s",
                    run_dir.path, ", ".join(run_dir.leftovers))
    run_info = {"algo": config.algo, "dataset": manifest.dataset,
                "num_clients": manifest.num_clients, "num_nodes": manifest.num_nodes,
                "backbone": config.backbone, "sampling": config.sampling,
                "world_size": comm.size, "shards": config.shards,
                "shards_fingerprint": fingerprint(manifest.raw),
                "shards_description": describe_shards(manifest.raw),
                # the graph apart from its partition: what mpifgl.bias compares a reference by
                "graph_fingerprint": graph_fingerprint(manifest.raw),
                "graph_description": describe_graph(manifest.raw)}
    if run_dir is not None:  # the server: whose records these are, and where it continued from
        run_info.update(run_identity(config, checkpoint))
    method = get_method(config.algo)
    if method.server_loads_graph:
        run_info["server_holds_whole_graph"] = True
    if comm.is_server and method.whole_graph_gnn:
        note = community_sampler_note(manifest.raw.get("partition"), config.sampling,
                                      "sampling" in explicit)
        if note:
            log.warning("%s", note)
    placements = comm.gather_objects(placement)
    if placements is not None:
        run_info["placement"] = describe_placements(placements)
    # collective: checks, with one sum over ranks, that the shards are one partition
    trainer = build_trainer(config, comm, graph, manifest.num_classes, run_dir, run_info,
                            placement.device, whole_graph)
    if config.resume:
        trainer.load_checkpoint(checkpoint)
        if run_dir is not None:
            if resumes_in_place(config):
                run_dir.reset_metrics(keep_through_epoch=trainer.state.epoch)
            else:  # a new directory: the resumed run's history up to its checkpoint
                run_dir.start_fresh()
                run_dir.reset_metrics(trainer.state.epoch, source=config.resume)
    elif run_dir is not None:
        run_dir.start_fresh()
    config = trainer.config  # sample size and steps per epoch resolved against the graph
    if run_dir is not None:
        resolved = {**config.to_dict(), "world_size": comm.size, "num_classes": manifest.num_classes,
                    "devices": [str(p.device) for p in placements],
                    "gpu_names": [p.gpu_name for p in placements],
                    "threads_per_rank": [p.threads for p in placements],
                    "hosts": [p.host for p in placements],
                    **{key: run_info[key] for key in RECORDED_IN_CONFIG}}
        run_dir.write_json("config.json", resolved)
        log.info("config: %s", " ".join(f"{k}={v}" for k, v in sorted(config.to_dict().items())))
    progress.trainer = trainer
    return trainer, config


# what config.json records of the run besides its flags: its shards and graph, its identity
RECORDED_IN_CONFIG = ("shards_fingerprint", "graph_fingerprint", "graph_description", "run_id",
                      "resumed_from")


def run_identity(config: TrainConfig, checkpoint: dict | None) -> dict:
    """The server's record of whose run this is: a new run id for a new run directory (a
    fresh run, or a resume into a new directory), the checkpoint's own when a run continues in
    place; and the checkpoint it continued from (None for a fresh run)."""
    if checkpoint is None:
        return {"run_id": new_run_id(), "resumed_from": None}
    source = os.path.abspath(config.resume)
    run_id = (checkpoint.get("run_id") or _saved_run_id(Path(source)) or new_run_id()
              if resumes_in_place(config) else new_run_id())
    return {"run_id": run_id, "resumed_from": {"run_id": checkpoint.get("run_id"),
                                               "epoch": checkpoint["epoch"], "path": source}}


def start_line(config: TrainConfig, trainer: Trainer, comm: Communicator) -> str:
    """The run's first line: what trains where, and how to continue it after a Ctrl-C on
    mpirun (which drops every later line)."""
    where = (f"({trainer.graph.num_nodes} nodes)" if comm.is_single_process
             else f"over {comm.num_clients} clients")
    whole = trainer.setup.whole_graph
    if whole is not None:  # LLCG as published: not federated (docs/privacy.md)
        where += (f", the server holding the whole graph ({whole.num_nodes} nodes, "
                  f"{whole.inner.nnz} directed edges, features and labels)")
    launch = f"mpirun -n {comm.size} " if comm.size > 1 else ""
    out = shlex.quote(config.out)
    every = ("every epoch" if config.checkpoint_every == 1
             else f"every {config.checkpoint_every} epochs")
    keep = (f"checkpoint {every}; once one is written, "
            f"`{launch}python -m {PROG} --resume {out}` continues" if config.checkpoint_every
            else "no checkpoints (--checkpoint-every K to resume after an interruption)")
    return (f"{config.algo} {config.backbone} {where} on {trainer.run_info['dataset']}, "
            f"{trainer.run_info.get('placement', '')}: {config.epochs} epochs -> {config.out} "
            f"({keep})")


def _mib(values: list[float]) -> str:
    low, high = min(values) / 2 ** 20, max(values) / 2 ** 20
    return f"{low:.1f} MiB" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f} MiB"


def summary_line(final: dict, out: str) -> str:
    """The run's last line: time, traffic and memory per rank, the best epoch's scores."""
    sent, memory = final["bytes_per_rank"], final["peak_rss_mb_per_rank"]
    if not sent:  # a resume of a run whose epochs were all done: only its final files
        traffic, peak = "none (no epoch left to run)", "not measured"
    elif len(sent) > 1:
        traffic = f"server {_mib(sent[:1])}, clients {_mib(sent[1:])} sent + received"
        peak = (f"server {memory[0]:.0f} MiB, clients {min(memory[1:]):.0f}-"
                f"{max(memory[1:]):.0f} MiB")
    else:
        traffic, peak = "none (one process)", f"{memory[0]:.0f} MiB"
    best = final["best_train_micro_f1"]
    train = f"train {best:.4f}, " if best is not None else ""
    resumed = final.get("resumed_from")
    if resumed:  # the totals are the whole run's; say which part this process ran
        this = final["parts"][-1]
        resumed = (f" (resumed from the checkpoint of epoch {resumed['epoch']} in "
                   f"{resumed['path']}; this part {this['epochs_run']} epochs in "
                   f"{this['wall_seconds']:.1f} s)")
    return (f"done in {final['wall_seconds']:.1f} s{resumed or ''}: {final['epochs_run']} "
            f"epochs, training "
            f"{final['mean_train_epoch_seconds']:.3f} s per epoch, evaluation "
            f"{final['eval_seconds']:.1f} s in all ({final['evaluations']} evaluations); "
            f"traffic {traffic}; peak memory {peak}; best val micro-F1 "
            f"{final['best_val_micro_f1']:.4f} at epoch {final['best_epoch']} ({train}test "
            f"{final['test_micro_f1']:.4f}){target_phrase(final)} -> {out}")


def target_phrase(final: dict) -> str:
    """'; val micro-F1 0.80 first reached at epoch 12, 3.4 s of training and evaluation (5.0 s
    wall)', or that it was not; empty without --target-val-f1."""
    target = final.get("target_val_micro_f1")
    if not target:
        return ""
    if final.get("target_epoch") is None:
        return f"; target val micro-F1 {target:.4f} not reached"
    return (f"; target val micro-F1 {target:.4f} first reached at epoch {final['target_epoch']}, "
            f"{final['seconds_to_target']:.1f} s of training and evaluation "
            f"({final['wall_seconds_to_target']:.1f} s wall)")


def train(config: TrainConfig, comm: Communicator, progress: RankProgress,
          explicit: set[str]) -> int:
    """Set up, train, write the outputs; the rank body that ``run_rank`` guards."""
    trainer, config = set_up(config, comm, progress, explicit)
    trainer.clock.started = progress.started  # the summary's wall time includes set-up
    log.info("%s", start_line(config, trainer, comm))
    final = trainer.run()
    if comm.is_server:
        log.info("%s", summary_line(final, config.out))
    if progress.run_dir is not None:
        progress.run_dir.release()
    return 0


def describe_placements(placements: list[hardware.Placement]) -> str:
    """Every rank's device and threads in a few words: 'cuda:0 (NVIDIA H200) x 9, 1 thread
    per rank'."""
    devices: dict[str, int] = {}
    for p in placements:
        key = f"{p.device} ({p.gpu_name})" if p.gpu_name else str(p.device)
        devices[key] = devices.get(key, 0) + 1
    threads = sorted({p.threads for p in placements})
    per_rank = "/".join(map(str, threads))
    where = ", ".join(f"{d} x {n}" if n > 1 else d for d, n in devices.items())
    return (f"{where}, {per_rank} thread{'s' if threads != [1] else ''} per rank"
            f"{describe_hosts([p.host for p in placements])}")


def describe_hosts(hosts: list[str]) -> str:
    """Which ranks run where, when they run on several hosts: ' on 2 hosts (node1: ranks 0-4,
    node2: ranks 5-8)'; empty on one host."""
    ranks: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        ranks.setdefault(host, []).append(rank)
    if len(ranks) < 2:
        return ""
    return (f" on {len(ranks)} hosts ("
            + ", ".join(f"{host}: rank{'s' if len(r) > 1 else ''} {rank_ranges(r)}"
                        for host, r in ranks.items()) + ")")


def rank_ranges(ranks: list[int]) -> str:
    """Ascending ranks in runs: [0, 1, 2, 4, 6, 7] -> '0-2,4,6-7'."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def run_rank(comm: Communicator, progress: RankProgress, body: Callable[[], int]) -> int:
    """The one failure rule of every rank (module docstring): agreed failures (set-up findings,
    a non-finite value) are printed by rank 0 and end every rank normally; anything else is
    printed by this rank and ends the whole job (``comm.abort``; in one process, the exit
    status). While it reports, further signals are ignored (one line, not tracebacks)."""
    try:
        return body()
    except AgreedFailure as exc:
        with signals_ignored():
            kept = ""
            if progress.run_dir is not None and progress.trainer is not None:
                kept = progress.kept(comm.size, repeatable=not isinstance(exc, NonFiniteError))
            progress.leave_run_dir()
            if comm.is_server:
                print(f"{PROG}: error: {exc}{kept}", file=sys.stderr, flush=True)
        return INPUT_ERROR
    except BaseException as exc:  # noqa: B036 - any failure must end the job, not hang it
        with signals_ignored():
            return report_and_abort(exc, comm, progress)


def report_and_abort(exc: BaseException, comm: Communicator, progress: RankProgress) -> int:
    """``run_rank``'s report of a failure of this rank alone: one line, then the job ends."""
    status = exit_status(exc)
    if not comm.is_single_process and (isinstance(exc, Interrupted) or progress.trainer is None):
        # A signal to every rank (srun, scancel), or a set-up error every rank meets alike,
        # must give one report: the lowest rank that has it reports, and its abort ends
        # the others while they still wait.
        time.sleep(REPORT_STAGGER * min(comm.rank, MAX_STAGGERED_RANKS))
    if progress.config.verbose:
        traceback.print_exc()
    who = ("" if comm.is_single_process else
           f" on {rank_label(comm.rank, comm.client_id, host_of(comm, comm.rank))}")
    if isinstance(exc, Interrupted):
        message = f"interrupted by {exc}{who} {progress.where()}"
    else:
        config = progress.trainer.config if progress.trainer is not None else progress.config
        message = (f"error{who} {progress.where()}: "
                   f"{describe(exc, config, comm.is_single_process)}")
    print(f"{PROG}: {message}{progress.kept(comm.size)}", file=sys.stderr, flush=True)
    progress.leave_run_dir()
    if not comm.is_single_process:
        comm.abort(status)  # one process returns its status instead (tests call main)
    return status


def report_stall(stall: Stall, comm: Communicator, progress: RankProgress) -> None:
    """The watchdog's report (its monitor thread aborts the job after it)."""
    print(f"{PROG}: error: {describe_stall(stall, progress.where())}{progress.kept(comm.size)}",
          file=sys.stderr, flush=True)
    progress.leave_run_dir()


def watchdog_timeout(progress: RankProgress) -> float:
    """--watchdog-seconds of the run's config (a resume may change it), auto: by the longest
    epoch so far."""
    trainer = progress.trainer
    longest = trainer.longest_epoch_seconds if trainer is not None else 0.0
    return timeout_seconds(parse_watchdog_seconds(progress.config.watchdog_seconds),
                           longest or None)


def run_centralized(config: TrainConfig, explicit: set[str]) -> int:
    if launcher_world_size() > 1:
        if launcher_rank() == 0:
            print(f"{PROG}: error: --algo {config.algo} runs in one process, but this job "
                  f"has {launcher_world_size()} ranks; launch without mpirun (or mpirun -n 1)",
                  file=sys.stderr)
        return USAGE_ERROR
    setup_logging("central", verbose=True)
    install_signal_handlers()
    comm, progress = LocalComm(), RankProgress(config)
    return run_rank(comm, progress, lambda: train(config, comm, progress, explicit))


def run_distributed(config: TrainConfig, explicit: set[str]) -> int:
    from mpifgl.comm import world  # the only path that initialises MPI
    comm = world()
    if comm.size < 2:
        print(f"{PROG}: error: world size 1: the distributed algorithm needs 1 server + at "
              "least 1 client; launch with mpirun -n M+1 (or use --algo centralized)",
              file=sys.stderr)
        return USAGE_ERROR
    setup_logging("server" if comm.is_server else f"client {comm.client_id}", comm.is_server)
    install_signal_handlers()
    progress = RankProgress(config)
    if parse_watchdog_seconds(config.watchdog_seconds) != 0:
        comm.start_watchdog(lambda: watchdog_timeout(progress),
                            lambda stall: report_stall(stall, comm, progress))
    return run_rank(comm, progress, lambda: train(config, comm, progress, explicit))


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv, quiet=launcher_rank() != 0)
    explicit = explicit_dests(build_parser(), argv if argv is not None else sys.argv[1:])
    if config.resume and "algo" not in explicit:  # the resumed run's method decides the launch
        saved = _saved_config(Path(config.resume))
        if saved is not None:
            config = config.replace(algo=saved[0].algo)
    method = get_method(config.algo)
    config = config.replace(**method.default_changes(explicit, config.layers))
    try:
        config.check_method_settings()  # a flag given may clash with the method's defaults
    except ValueError as exc:
        if launcher_rank() == 0:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    if not method.distributed:
        return run_centralized(config, explicit)
    return run_distributed(config, explicit)


if __name__ == "__main__":
    sys.exit(main())
