"""Entry point: ``mpirun -n M+1 python -m mpifgl.train --shards DIR --out RUN_DIR``.

It only sequences the run: parse and validate the config, resolve the shards (preparing the
default dataset's if none are given), check every input on every rank before the first training
collective, build the rank's graph, train, write outputs. Errors in set-up end all ranks with one
message from rank 0; an exception later aborts the whole job instead of leaving ranks hanging.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mpifgl.algorithms import get_algorithm
from mpifgl.config import TrainConfig, build_parser, explicit_flags, resumed_config
from mpifgl.graph import ClientGraph
from mpifgl.runlog import RunDirectory, check_run_dir_writable, load_checkpoint
from mpifgl.shards import (ShardError, check_shard_against_manifest, file_sha256,
                           load_client_shard, read_manifest, shard_filename)
from mpifgl.trainer import LocalComm, Trainer

log = logging.getLogger("mpifgl")
USAGE_ERROR, INPUT_ERROR = 2, 1


class SetupError(Exception):
    """A user-facing problem found before training starts."""


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
    config = TrainConfig(**vars(parser.parse_args(argv)))
    try:
        config.validate()
    except ValueError as exc:
        if not quiet:
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    return config


def default_shard_dir(config: TrainConfig, num_clients: int) -> Path:
    return Path("shards") / f"{config.dataset}-{num_clients}clients-random-seed0"


def default_run_dir(config: TrainConfig, dataset: str) -> str:
    return str(Path("runs") / f"{dataset}-{config.algo}-{time.strftime('%Y%m%d-%H%M%S')}")


def prepare_default_shards(config: TrainConfig, shard_dir: Path, num_clients: int) -> None:
    from data_prep.api import prepare_shards  # only the default run needs data_prep
    log.warning("no --shards given: preparing %s with %d clients in %s (once)", config.dataset,
                num_clients, shard_dir)
    prepare_shards(config.dataset, num_clients, "random", 0, config.data_root or None, shard_dir)


def resolve_shards(config: TrainConfig, comm: Any, num_clients: int) -> TrainConfig:
    """The shard directory every rank will read; the server prepares the default one if needed."""
    if config.shards:
        return config
    shard_dir = default_shard_dir(config, num_clients)
    error = None
    if comm.is_server and not (shard_dir / "manifest.json").is_file():
        try:
            prepare_default_shards(config, shard_dir, num_clients)
        except Exception as exc:  # reported to every rank below
            error = f"preparing default shards in {shard_dir} failed: {exc}"
    if hasattr(comm, "wait_for_server"):
        comm.wait_for_server()
    error = comm.broadcast_object(error)
    if error:
        raise SetupError(error)
    return config.replace(shards=str(shard_dir))


def load_rank_graph(config: TrainConfig, comm: Any, manifest) -> ClientGraph:
    """The server gets an empty graph (it opens no shard); a client loads and checks its own."""
    sizes = manifest.client_sizes()
    if comm.is_server and not isinstance(comm, LocalComm):
        return ClientGraph.empty(sizes, manifest.num_features)
    if isinstance(comm, LocalComm):
        shards = [load_checked_shard(config, manifest, i) for i in range(manifest.num_clients)]
        return ClientGraph.merged(shards)
    return ClientGraph.from_shard(load_checked_shard(config, manifest, comm.client_id), sizes)


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
    return shard


def set_up(config: TrainConfig, comm: Any,
           explicit: set[str] = frozenset()) -> tuple["Trainer", TrainConfig]:
    """Everything before the first training collective. Raises SetupError on every rank alike."""
    distributed = not isinstance(comm, LocalComm)
    checkpoint = None
    error = None
    if config.resume and comm.is_server:
        try:
            checkpoint = load_checkpoint(config.resume)
        except (ValueError, FileNotFoundError) as exc:
            error = str(exc)
    if config.resume:
        error = comm.broadcast_object(error)
        if error:
            raise SetupError(error)
        saved = comm.broadcast_object(checkpoint["config"] if checkpoint else None)
        config = resumed_config(saved, config, explicit)
    num_clients = comm.size - 1 if distributed else 1
    config = resolve_shards(config, comm, max(1, num_clients) if distributed else 8)
    manifest = read_manifest(config.shards)  # every rank reads the same file: same verdict
    if distributed and comm.size != manifest.num_clients + 1:
        raise SetupError(f"world size {comm.size} != 1 server + {manifest.num_clients} clients "
                         f"(manifest {Path(config.shards) / 'manifest.json'}); launch with "
                         f"mpirun -n {manifest.num_clients + 1}")
    if checkpoint is not None and checkpoint.get("world_size") != comm.size:
        error = (f"--resume {config.resume}: checkpoint written with {checkpoint.get('world_size')}"
                 f" ranks, this job has {comm.size}")
    if comm.is_server and not config.out:
        config = config.replace(out=default_run_dir(config, manifest.dataset))
    config = comm.broadcast_object(config) if distributed else config
    if comm.is_server and error is None:
        error = check_run_dir_writable(config.out, config.force, bool(config.resume))
    graph = None
    try:
        graph = load_rank_graph(config, comm, manifest)
    except (ShardError, OSError) as exc:
        error = error or str(exc)
    errors = comm.agree_on_errors(error) if distributed else ([(0, error)] if error else [])
    if errors:
        raise SetupError("\n".join(message if not distributed else
                                   f"rank {rank}: {message}" for rank, message in errors))
    run_dir = RunDirectory(config.out) if comm.is_server else None
    run_info = {"algo": config.algo, "dataset": manifest.dataset,
                "num_clients": manifest.num_clients, "num_nodes": manifest.num_nodes,
                "backbone": config.backbone, "sampling": config.sampling,
                "world_size": comm.size, "shards": config.shards}
    trainer_class = get_algorithm(config.algo).trainer_class()
    trainer = trainer_class(config, comm, graph, manifest.num_classes, run_dir, run_info)
    if config.resume:
        trainer.load_checkpoint(checkpoint)
        if run_dir is not None:
            run_dir.reset_metrics(keep_through_epoch=trainer.state.epoch)
    elif run_dir is not None:
        run_dir.start_fresh()
    config = trainer.config  # sample size and steps per epoch resolved against the graph
    if run_dir is not None:
        resolved = {**config.to_dict(), "world_size": comm.size, "num_classes": manifest.num_classes,
                    "torch_threads": torch.get_num_threads()}
        run_dir.write_json("config.json", resolved)
        log.info("config: %s", " ".join(f"{k}={v}" for k, v in sorted(config.to_dict().items())))
    return trainer, config


def run_centralized(config: TrainConfig, explicit: set[str]) -> int:
    if launcher_world_size() > 1:
        if launcher_rank() == 0:
            print(f"mpifgl.train: error: --algo {config.algo} runs in one process, but this job "
                  f"has {launcher_world_size()} ranks; launch without mpirun (or mpirun -n 1)",
                  file=sys.stderr)
        return USAGE_ERROR
    setup_logging("central", verbose=True)
    try:
        trainer, config = set_up(config, LocalComm(), explicit)
    except (SetupError, ShardError, ValueError) as exc:
        print(f"mpifgl.train: error: {exc}", file=sys.stderr)
        return INPUT_ERROR
    log.info("%s %s on %s: %d nodes, %d epochs -> %s", config.algo, config.backbone,
             trainer.run_info["dataset"], trainer.graph.num_nodes, config.epochs, config.out)
    final = trainer.run()
    log.info("done: test micro-F1 %.4f at best val epoch %d -> %s", final["test_micro_f1"],
             final["best_epoch"], config.out)
    return 0


def run_distributed(config: TrainConfig, explicit: set[str]) -> int:
    from mpifgl.comm import world  # the only path that initialises MPI
    comm = world()
    if comm.size > (os.cpu_count() or 1):
        torch.set_num_threads(1)  # oversubscribed: one thread per rank, no thrashing
    setup_logging("server" if comm.is_server else f"client {comm.client_id}", comm.is_server)
    if comm.size < 2:
        print("mpifgl.train: error: world size 1: the distributed algorithm needs 1 server + at "
              "least 1 client; launch with mpirun -n M+1 (or use --algo centralized)",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        trainer, config = set_up(config, comm, explicit)
    except (SetupError, ShardError, ValueError) as exc:
        if comm.is_server:
            print(f"mpifgl.train: error: {exc}", file=sys.stderr)
        return INPUT_ERROR
    try:
        if comm.is_server:
            log.info("%s %s over %d clients on %s: %d epochs -> %s", config.algo, config.backbone,
                     comm.size - 1, trainer.run_info["dataset"], config.epochs, config.out)
        final = trainer.run()
        if comm.is_server:
            log.info("done: test micro-F1 %.4f at best val epoch %d -> %s",
                     final["test_micro_f1"], final["best_epoch"], config.out)
    except BaseException as exc:  # one failing rank must end the job, not hang it
        log.error("aborting the job: %s: %s", type(exc).__name__, exc, exc_info=True)
        comm.abort(1)
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv, quiet=launcher_rank() != 0)
    explicit = explicit_flags(argv if argv is not None else sys.argv[1:])
    algorithm = get_algorithm(config.algo)
    config = algorithm.with_defaults(config, explicit)
    if not algorithm.distributed:
        return run_centralized(config, explicit)
    return run_distributed(config, explicit)


if __name__ == "__main__":
    sys.exit(main())
