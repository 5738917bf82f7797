"""Every name a choice flag can take and where its implementation lives: the one list of training
methods (``--algo``), backbones (``--backbone``), cross-client exchanges (``--exchange``),
samplings (``--sampling``), optimizers (``--optimizer``) and client weights
(``--client-weights``). ``mpifgl.config`` takes its choices from here.

Nothing here imports torch or another mpifgl module: the configuration and the study's driver
read the lists without loading the model. An implementation is named as "module:attribute" and
imported on use (``Entry.load``), so an unused method or exchange costs nothing at start-up.

Adding a backbone: its layer class (``mpifgl.model.GraphLayer``) and one ``BACKBONES`` line.
Adding an exchange mode: its module (``mpifgl.exchange.base.Exchange``) and one ``EXCHANGES`` line.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Entry:
    """One choice of a flag: its name, its implementation and what it is, in a line."""

    name: str
    path: str  # "module:attribute", imported on use
    summary: str
    # --secure can mask it (a method: its cross-client exchange; an exchange: its messages)
    maskable: bool = False
    # an exchange whose values --wire-dtype may carry in 16 bits (the server sums, not MPI)
    narrow_wire: bool = False
    short: str = ""  # a backbone's name in tables and legends ("GCN")

    def load(self) -> Any:
        module, _, attribute = self.path.partition(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Method(Entry):
    """An ``--algo``: its builder takes a ``mpifgl.trainer.RankSetup`` and returns the rank's
    ``TrainingMethod``."""

    distributed: bool = True  # runs under mpirun (server + clients); else in one process
    # trains mpifgl.model's GNN through methods.gnn.GNNMethod (so --exact-first-layer applies)
    whole_graph_gnn: bool = False
    # Flag defaults of this method that differ from TrainConfig's; an explicit flag wins.
    defaults: tuple[tuple[str, Any], ...] = ()
    # its rounds average the clients' models (FedAvg's aggregation): --client-weights applies
    averages_models: bool = False
    # a pre-training round of neighbour-feature sums (FedGCN): --hops applies
    neighbour_round: bool = False
    # the server loads every shard and holds the whole graph (LLCG's correction needs it; the
    # start line and docs/privacy.md say so); else it opens no shard
    server_loads_graph: bool = False
    # samples neighbours per hop: its --fanouts default for a depth (one value per layer)
    fanouts_at_depth: Callable[[int], tuple[int, ...]] | None = None

    def default(self, name: str, fallback: Any = None) -> Any:
        """This method's default of flag ``name`` (``fallback`` where it keeps TrainConfig's)."""
        return dict(self.defaults).get(name, fallback)

    def default_changes(self, explicit: set[str], layers: int) -> dict[str, Any]:
        """This method's defaults for the flags not given explicitly, for the caller's
        ``config.replace(**changes)``; ``layers``: the run's --layers, which a fan-out default
        follows."""
        changes = {name: value for name, value in self.defaults if name not in explicit}
        if self.fanouts_at_depth is not None and "fanouts" not in explicit:
            changes["fanouts"] = self.fanouts_at_depth(layers)
        return changes


def graphsage_fanouts(layers: int) -> tuple[int, ...]:
    """GraphSAGE's fan-outs: its paper's 25,10 at 2 layers (25 at 1), OGB's products example's
    15,10,5 at 3, and 5 for every layer past the third (a 3-hop neighbourhood of 15 x 10 x 5
    already covers most of a small graph)."""
    if layers <= 2:
        return (25, 10)[:layers]
    return (15, 10, 5) + (5,) * (layers - 3)


def llcg_fanouts(layers: int) -> tuple[int, ...]:
    """LLCG's reference samples 10 neighbours at every layer (MortezaRamezani/llcg)."""
    return (10,) * layers


def _table(*entries: Entry) -> dict[str, Any]:
    return {entry.name: entry for entry in entries}


METHODS: dict[str, Method] = _table(
    Method("ours", "mpifgl.methods.gnn:build_gnn",
           "distributed GNN with cross-client exchange and label-guided sampling", maskable=True,
           whole_graph_gnn=True),
    # The reference is full batch (the paper's centralized GCN); --sampling label|uniform makes
    # it ``ours`` in one process, to check the sampler without MPI.
    Method("centralized", "mpifgl.methods.gnn:build_gnn",
           "the same model code on the whole graph in one process, full batch",
           distributed=False, defaults=(("sampling", "none"),), whole_graph_gnn=True),
    Method("graphsage", "mpifgl.methods.sampled:GraphSAGEMethod",
           "centralized GraphSAGE with neighbour sampling (Hamilton et al., 2017)",
           distributed=False, fanouts_at_depth=graphsage_fanouts),
    Method("graphsaint", "mpifgl.methods.sampled:GraphSAINTMethod",
           "centralized GraphSAINT random-walk subgraph sampling (Zeng et al., 2020)",
           distributed=False),
    Method("fedavg", "mpifgl.methods.fedavg:build_fedavg",
           "FedAvg on local subgraphs, cross-client edges dropped (McMahan et al., 2017)",
           averages_models=True),
    Method("fedavg-nc", "mpifgl.methods.fedavg:build_fedavg_nc",
           "FedAvg with a random share of cross-client neighbours collected",
           averages_models=True),
    # FedAvg's classifier on local graphs mended with generated neighbours; the reference
    # averages the clients' models equally
    Method("fedsage-plus", "mpifgl.methods.fedsage:FedSagePlusMethod",
           "FedSage+: missing neighbours generated by NeighGen, then FedAvg (Zhang et al., "
           "NeurIPS 2021)", defaults=(("client_weights", "uniform"),), averages_models=True),
    Method("bns", "mpifgl.methods.bns:build_bns",
           "BNS-GCN boundary-node sampling in the distributed model (Wan et al., MLSys 2022)",
           maskable=True, whole_graph_gnn=True),
    # exact full batch with GCN layers only: --sampling none is its one setting
    Method("cagnet", "mpifgl.methods.cagnet:build_cagnet",
           "CAGNET 1.5D full-batch GCN over the client ranks: block rows, broadcasts in column "
           "groups, allreduce in row groups (Tripathy, Yelick, Buluc, SC 2020)",
           defaults=(("sampling", "none"),)),
    # the reference's settings (yh-yao/FedGCN, FedGraph): SGD lr 0.5, weight decay 5e-4, 3 local
    # full-batch steps per round, hidden 16, dropout 0.5, the unweighted mean over clients
    Method("fedgcn", "mpifgl.methods.fedgcn:build_fedgcn",
           "FedGCN: one pre-training round of neighbour-feature sums, then FedAvg (Yao et al., "
           "2023)", maskable=True, averages_models=True, neighbour_round=True,
           defaults=(("optimizer", "sgd"), ("lr", 0.5), ("weight_decay", 5e-4),
                     ("local_epochs", 3), ("hidden", 16), ("dropout", 0.5),
                     ("client_weights", "uniform"), ("hops", 2))),
    # the reference's local batch and fan-out (MortezaRamezani/llcg, docs/algorithms.md)
    Method("llcg", "mpifgl.methods.llcg:build_llcg",
           "LLCG: periodic averaging of local neighbour-sampled steps, corrected on the whole "
           "graph at the server (Ramezani et al., ICLR 2022)",
           defaults=(("batch_size", 256),), server_loads_graph=True,
           fanouts_at_depth=llcg_fanouts),
)

BACKBONES: dict[str, Entry] = _table(
    Entry("gcn", "mpifgl.model:GCNLayer", "GCN (Kipf & Welling), PyG GCNConv", short="GCN"),
    Entry("1gnn", "mpifgl.model:OneGNNLayer", "1-GNN (Morris et al.), PyG GraphConv, sum",
          short="1-GNN"),
    Entry("sage", "mpifgl.model:SAGELayer", "GraphSAGE-mean (Hamilton et al.), PyG SAGEConv, "
          "the neighbours' mean and the node's own row weighted apart", short="SAGE"),
)

EXCHANGES: dict[str, Entry] = _table(
    Entry("compact", "mpifgl.exchange.compact:CompactExchange",
          "each client sends only its non-zero rows (ids once per sample), summed at the "
          "server (Gatherv)", maskable=True, narrow_wire=True),
    Entry("compact-reduce", "mpifgl.exchange.compact_reduce:CompactReduceExchange",
          "the same rows summed by MPI_Reduce over the rows any client touches (partial sums "
          "may be added on other client ranks)"),
    Entry("reduce", "mpifgl.exchange.dense:ReduceExchange",
          "MPI_Reduce of a dense buffer of every sampled row"),
    Entry("star", "mpifgl.exchange.dense:StarExchange",
          "dense buffers gathered and summed at the server only"),
)

SAMPLINGS: dict[str, Entry] = _table(
    Entry("label", "mpifgl.sampling:label_guided_distribution",
          "label-guided (ours): each training class by its global frequency"),
    Entry("uniform", "mpifgl.sampling:uniform_distribution",
          "the same estimator with a uniform distribution"),
    Entry("none", "", "the full graph every step (ours-full; the default of --algo centralized)"),
)


OPTIMIZERS: dict[str, Entry] = _table(
    Entry("adam", "mpifgl.optim:Adam", "Adam, L2 weight decay added to the gradient (the "
          "paper's)"),
    Entry("sgd", "mpifgl.optim:SGD", "plain SGD, no momentum, L2 weight decay added to the "
          "gradient (FedGCN's)"),
)

# --client-weights: a client's weight in a model average, its training nodes or 1 (the mean)
CLIENT_WEIGHTS = ("train", "uniform")


def lookup(table: dict[str, Any], flag: str, name: str) -> Any:
    """``table[name]``, or a ValueError naming the flag, the value and the choices."""
    if name not in table:
        raise ValueError(f"--{flag} {name!r}, expected one of {', '.join(table)}")
    return table[name]


def maskable(table: dict[str, Entry]) -> tuple[str, ...]:
    return tuple(name for name, entry in table.items() if entry.maskable)
