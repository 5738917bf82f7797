"""The training methods (``--algo``): which one builds each rank's side, and whether it needs MPI.
One place to add a method.

A distributed method runs under ``mpirun -n M+1`` (server + M clients, graph per client from
its own shard); a centralized one runs in one process on the merged shards. Every method is
driven by the same ``mpifgl.trainer.Trainer`` loop, so it writes the same run directory (metrics,
final.json, model.pt, logits); a method builds only its own model, optimizer and step.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from mpifgl.config import TrainConfig

if TYPE_CHECKING:  # the catalog is read by tools that must not load torch (the study's driver)
    from mpifgl.communicator import Communicator
    from mpifgl.graph import ClientGraph
    from mpifgl.runlog import RunDirectory
    from mpifgl.trainer import RankSetup, Trainer, TrainingMethod


@dataclass(frozen=True)
class Method:
    name: str
    distributed: bool  # runs under mpirun (server + clients); else in one process
    # "module:callable(RankSetup)", imported on use so unused methods cost nothing
    builder_path: str
    summary: str
    # Flag defaults of this method that differ from TrainConfig's; an explicit flag wins.
    defaults: tuple[tuple[str, Any], ...] = ()

    def builder(self) -> Callable[[RankSetup], TrainingMethod]:
        module, _, name = self.builder_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def with_defaults(self, config: TrainConfig, explicit: set[str]) -> TrainConfig:
        """``config`` with this method's defaults for the flags not given explicitly."""
        changes = {name: value for name, value in self.defaults if name not in explicit}
        return config.replace(**changes) if changes else config


METHODS = {m.name: m for m in (
    Method("ours", True, "mpifgl.methods.gnn:build_gnn",
           "distributed GNN with cross-client exchange and label-guided sampling"),
    # The reference is full batch (the paper's centralized GCN); --sampling label|uniform makes
    # it ``ours`` in one process, to check the sampler without MPI.
    Method("centralized", False, "mpifgl.methods.gnn:build_gnn",
           "the same model code on the whole graph in one process, full batch",
           defaults=(("sampling", "none"),)),
    Method("bns", True, "mpifgl.methods.bns:build_bns",
           "BNS-GCN boundary-node sampling in the distributed model (Wan et al., MLSys 2022)"),
    Method("fedavg", True, "mpifgl.methods.fedavg:build_fedavg",
           "FedAvg on local subgraphs, cross-client edges dropped (McMahan et al., 2017)"),
    Method("fedavg-nc", True, "mpifgl.methods.fedavg:build_fedavg_nc",
           "FedAvg with a random share of cross-client neighbours collected"),
    Method("graphsage", False, "mpifgl.methods.sampled:GraphSAGEMethod",
           "centralized GraphSAGE with neighbour sampling (Hamilton et al., 2017)"),
    Method("graphsaint", False, "mpifgl.methods.sampled:GraphSAINTMethod",
           "centralized GraphSAINT random-walk subgraph sampling (Zeng et al., 2020)"),
)}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"--algo {name!r}, expected one of {', '.join(METHODS)}")
    return METHODS[name]


def build_trainer(config: TrainConfig, comm: Communicator, graph: ClientGraph, num_classes: int,
                  run_dir: RunDirectory | None = None,
                  run_info: dict[str, Any] | None = None) -> Trainer:
    """This rank's Trainer for ``config.algo`` (collective: every rank builds its own)."""
    from mpifgl.trainer import RankSetup, Trainer
    setup = RankSetup.create(config, comm, graph, num_classes)
    return Trainer(setup, get_method(config.algo).builder()(setup), run_dir, run_info)
