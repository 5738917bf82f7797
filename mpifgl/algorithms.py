"""Which trainer runs each ``--algo``, and whether it needs MPI. One place to add a method.

A distributed algorithm runs under ``mpirun -n M+1`` (server + M clients, graph per client from
its own shard); a centralized one runs in one process on the merged shards. Every algorithm is a
``Trainer`` subclass, so it writes the same run directory (metrics, final.json, model.pt, logits).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Algorithm:
    name: str
    distributed: bool
    trainer_path: str  # "module:Class", imported on use so unused baselines cost nothing
    summary: str
    # Flag defaults of this algorithm that differ from TrainConfig's; an explicit flag wins.
    defaults: tuple[tuple[str, Any], ...] = ()

    def trainer_class(self):
        module, _, name = self.trainer_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def with_defaults(self, config, explicit: set[str]):
        """``config`` with this algorithm's defaults for the flags not given explicitly."""
        changes = {name: value for name, value in self.defaults if name not in explicit}
        return config.replace(**changes) if changes else config


ALGORITHMS = {a.name: a for a in (
    Algorithm("ours", True, "mpifgl.trainer:Trainer",
              "distributed GNN with cross-client exchange and label-guided sampling"),
    # The reference is full batch (the paper's centralized GCN); --sampling label|uniform makes
    # it ``ours`` in one process, to check the sampler without MPI.
    Algorithm("centralized", False, "mpifgl.trainer:Trainer",
              "the same model code on the whole graph in one process, full batch",
              defaults=(("sampling", "none"),)),
    Algorithm("bns", True, "mpifgl.baselines.bns:BNSTrainer",
              "BNS-GCN boundary-node sampling in the distributed model (Wan et al., MLSys 2022)"),
    Algorithm("fedavg", True, "mpifgl.baselines.fedavg:FedAvgTrainer",
              "FedAvg on local subgraphs, cross-client edges dropped (McMahan et al., 2017)"),
    Algorithm("fedavg-nc", True, "mpifgl.baselines.fedavg:FedAvgNCTrainer",
              "FedAvg with a random share of cross-client neighbours collected"),
    Algorithm("graphsage", False, "mpifgl.baselines.sampled:GraphSAGETrainer",
              "centralized GraphSAGE with neighbour sampling (Hamilton et al., 2017)"),
    Algorithm("graphsaint", False, "mpifgl.baselines.sampled:GraphSAINTTrainer",
              "centralized GraphSAINT random-walk subgraph sampling (Zeng et al., 2020)"),
)}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"--algo {name!r}, expected one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
