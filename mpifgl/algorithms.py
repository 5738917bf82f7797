"""Which trainer runs each ``--algo``, and whether it needs MPI. One place to add a method.

A distributed algorithm runs under ``mpirun -n M+1`` (server + M clients, graph per client from
its own shard); a centralized one runs in one process on the merged shards. Every algorithm is a
``Trainer`` subclass, so it writes the same run directory (metrics, final.json, model.pt, logits).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    name: str
    distributed: bool
    trainer_path: str  # "module:Class", imported on use so unused baselines cost nothing
    summary: str

    def trainer_class(self):
        module, _, name = self.trainer_path.partition(":")
        return getattr(importlib.import_module(module), name)


ALGORITHMS = {a.name: a for a in (
    Algorithm("ours", True, "mpifgl.trainer:Trainer",
              "distributed GNN with cross-client exchange and label-guided sampling"),
    Algorithm("centralized", False, "mpifgl.trainer:Trainer",
              "the same model code on the whole graph in one process"),
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
