"""The one method catalog of the study: every method's name, its label in the report's tables,
the ``mpifgl.train`` algorithm and flags that make it, and the sections it is a row of.

The plan (``study.plan``) and the report (``study.report``) both read this module; a method
added here appears in the plan, the run directory names and the tables.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpifgl.methods import get_method
from mpifgl.registry import BACKBONES

# The paper's tables and figures, in report order, numbered as the paper's source numbers them
# (table 3: time and memory per epoch, tab:time cost; table 5: the ablation, tab:norm).
SECTIONS = ("table2", "fig3", "fig4", "table3", "table5", "fig5", "fig6")


@dataclass(frozen=True)
class Method:
    """A row of the report: an ``--algo`` of ``mpifgl.train`` plus the flags that make the variant."""

    name: str  # in run directory names, plan.json and the CSVs
    label: str  # in the Markdown tables and plot legends; "{layer}": the backbone's short name
    algo: str  # mpifgl.train --algo
    flags: tuple[str, ...] = ()  # extra mpifgl.train flags
    # the method's own learning rate, which the study's --lr and its search leave alone (a
    # baseline whose reference optimizer is not the Adam that the study's lr grid is for)
    lr: float | None = None

    @property
    def distributed(self) -> bool:
        """Runs under ``mpirun -n M+1`` (else one process on the merged shards)."""
        return get_method(self.algo).distributed


METHODS = {m.name: m for m in (
    Method("ours", "Ours ({layer})", "ours"),
    Method("ours-1gnn", "Ours ({layer})", "ours", ("--backbone", "1gnn")),
    Method("centralized", "Centralized {layer}", "centralized"),
    Method("centralized-1gnn", "Centralized {layer}", "centralized", ("--backbone", "1gnn")),
    # GraphSAGE-mean layers, those of the sampled methods on OGB's products leaderboard
    Method("ours-sage", "Ours ({layer})", "ours", ("--backbone", "sage")),
    Method("centralized-sage", "Centralized {layer}", "centralized", ("--backbone", "sage")),
    Method("graphsage", "GraphSAGE", "graphsage"),
    Method("graphsaint", "GraphSAINT", "graphsaint"),
    Method("fedavg", "FedAvg+{layer}", "fedavg"),
    Method("fedavg-nc", "FedAvg+NC (20%)", "fedavg-nc"),
    # FedAvg's classifier on local graphs mended with NeighGen's generated neighbours
    Method("fedsage-plus", "FedSage+ ({layer})", "fedsage-plus"),
    Method("bns", "BNS-{layer}", "bns"),  # BNS-GCN on the default layer
    # CAGNET's 1.5D algorithm (replication 2, its default here) and its 1D one
    Method("cagnet", "CAGNET (1.5D, c = 2)", "cagnet"),
    Method("cagnet-1d", "CAGNET (1D)", "cagnet", ("--replication", "1")),
    # the server holds the whole graph, as LLCG as published does (docs/privacy.md)
    Method("llcg", "LLCG+{layer}", "llcg"),
    Method("ours-full", "ours-full", "ours", ("--sampling", "none")),  # no sampling
    Method("ours-star", "ours*", "ours", ("--no-normalize",)),  # sampling without 1/p
    # beyond the paper: layer 1 aggregated exactly once at set-up, sampling above it
    Method("ours-exact1", "ours, exact layer 1", "ours", ("--exact-first-layer",)),
    # beyond the paper: control variates from the hidden layers' inputs, refreshed every 5
    # epochs (docs/paper_scale.md, section 6: centralized's score at fewer bytes than ours)
    Method("ours-history", "ours, history", "ours", ("--history-every", "5")),
    # beyond the paper: each sample normalised as a graph of its own, as OGB's GraphSAINT
    # (docs/paper_scale.md, section 9)
    Method("ours-subgraph", "ours, subgraph norm", "ours", ("--subgraph-norm",)),
    # the masked exchange and sums (docs/privacy.md): what privacy costs in time and bytes
    Method("ours-secure", "Ours ({layer}, --secure)", "ours", ("--secure",)),
    # FedGCN at its reference settings (mpifgl.registry), SGD at its own lr 0.5; 0 hops is
    # FedAvg with those settings, so fedgcn-0hop against fedgcn isolates the round's effect
    Method("fedgcn", "FedGCN 2-hop ({layer})", "fedgcn", lr=0.5),
    Method("fedgcn-1hop", "FedGCN 1-hop ({layer})", "fedgcn", ("--hops", "1"), lr=0.5),
    Method("fedgcn-0hop", "FedGCN 0-hop ({layer})", "fedgcn", ("--hops", "0"), lr=0.5),
    # FedGraph's sym round with the study's optimizer and width (Adam, hidden 128): where the
    # unweighted sums diverge (amazon-computers' bag-of-words rows, docs/results.md section 3)
    Method("fedgcn-sym", "FedGCN 2-hop, sym round, Adam ({layer})", "fedgcn",
           ("--round-norm", "sym", "--optimizer", "adam", "--hidden", "128"), lr=0.01),
)}

# The rows of each section, in table order. Figures 3 and 4 also run "centralized" as the
# reference their local bias is measured against (see study.plan).
SECTION_METHODS = {
    "table2": ("ours", "ours-1gnn", "centralized", "centralized-1gnn", "graphsage",
               "graphsaint", "fedavg", "fedavg-nc", "fedsage-plus", "bns", "cagnet", "fedgcn",
               "fedgcn-sym", "fedgcn-1hop", "fedgcn-0hop", "llcg"),
    "fig3": ("ours", "fedavg", "fedavg-nc", "fedsage-plus", "fedgcn", "fedgcn-0hop", "llcg"),
    "fig4": ("ours", "fedavg", "fedavg-nc", "fedsage-plus", "fedgcn", "fedgcn-sym", "fedgcn-0hop",
             "llcg"),
    # the paper's CAGNET (1.5D) beside its 1D form; ours-secure: ours with --secure
    "table3": ("cagnet", "cagnet-1d", "fedavg", "ours", "ours-secure"),
    "table5": ("ours-full", "ours-star", "ours"),  # the ablation
    "fig5": ("ours",),
    "fig6": ("ours", "ours-full"),
}
REFERENCE_METHOD = "centralized"  # local bias = distance of a run's logits to this method's


def methods_of(section: str) -> tuple[str, ...]:
    """Names of the methods that are rows of ``section``, in table order."""
    return SECTION_METHODS[section]


def label_of(name: str, backbone: str = "gcn") -> str:
    """Label of method ``name`` in tables, its layer named as the method's own ``--backbone``
    flag or else ``backbone`` sets it; a name the catalog does not know (an older plan) is its
    own label."""
    if name not in METHODS:
        return name
    method = METHODS[name]
    if "--backbone" in method.flags:
        backbone = method.flags[method.flags.index("--backbone") + 1]
    return method.label.format(layer=BACKBONES[backbone].short)


def algo_of(name: str) -> str:
    """``--algo`` of method ``name``; an unknown name is taken as an algorithm name."""
    return METHODS[name].algo if name in METHODS else name
