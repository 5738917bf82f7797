"""The training methods (``--algo``): the rank's side of each is built from the registry
(``mpifgl.registry.METHODS``, the one list of methods).

A distributed method runs under ``mpirun -n M+1`` (server + M clients, graph per client from
its own shard); a centralized one runs in one process on the merged shards. Every method is
driven by the same ``mpifgl.trainer.Trainer`` loop, so it writes the same run directory (metrics,
final.json, model.pt, logits); a method builds only its own model, optimizer and step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpifgl.config import TrainConfig
from mpifgl.registry import METHODS, Method, lookup

if TYPE_CHECKING:  # the catalog is read by tools that must not load torch (the study's driver)
    from mpifgl.communicator import Communicator
    from mpifgl.graph import ClientGraph
    from mpifgl.runlog import RunDirectory
    from mpifgl.trainer import Trainer

__all__ = ["METHODS", "Method", "build_trainer", "get_method"]


def get_method(name: str) -> Method:
    return lookup(METHODS, "algo", name)


def build_trainer(config: TrainConfig, comm: Communicator, graph: ClientGraph, num_classes: int,
                  run_dir: RunDirectory | None = None,
                  run_info: dict[str, Any] | None = None, device: Any = "cpu",
                  whole_graph: ClientGraph | None = None) -> Trainer:
    """This rank's Trainer for ``config.algo`` on ``device`` (collective: every rank builds its
    own). A method's ``setup_summary`` (what its set-up did, e.g. the bytes it moved) joins
    ``run_info`` and so final.json. ``whole_graph``: the merged graph the server of such a
    method holds."""
    from mpifgl.trainer import RankSetup, Trainer
    setup = RankSetup.create(config, comm, graph, num_classes, device, whole_graph)
    method = get_method(config.algo).load()(setup)
    info = {**(run_info or {}), **getattr(method, "setup_summary", {})}
    return Trainer(setup, method, run_dir, info)
