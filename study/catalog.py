"""The one method catalog of the study: every method's name, its label in the report's tables,
the ``mpifgl.train`` algorithm and flags that make it, and the sections it is a row of.

The plan (``study.plan``) and the report (``study.report``) both read this module; a method
added here appears in the plan, the run directory names and the tables.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpifgl.methods import get_method
from mpifgl.registry import BACKBONES

# The paper's tables and figures, in report order.
SECTIONS = ("table2", "fig3", "fig4", "table4", "table5", "fig5", "fig6")


@dataclass(frozen=True)
class Method:
    """A row of the report: an ``--algo`` of ``mpifgl.train`` plus the flags that make the variant."""

    name: str  # in run directory names, plan.json and the CSVs
    label: str  # in the Markdown tables and plot legends; "{layer}": the backbone's short name
    algo: str  # mpifgl.train --algo
    flags: tuple[str, ...] = ()  # extra mpifgl.train flags

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
    Method("bns", "BNS-{layer}", "bns"),  # BNS-GCN on the default layer
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
)}

# The rows of each section, in table order. Figures 3 and 4 also run "centralized" as the
# reference their local bias is measured against (see study.plan).
SECTION_METHODS = {
    "table2": ("ours", "ours-1gnn", "centralized", "centralized-1gnn", "graphsage",
               "graphsaint", "fedavg", "fedavg-nc", "bns", "llcg"),
    "fig3": ("ours", "fedavg", "fedavg-nc", "llcg"),
    "fig4": ("ours", "fedavg", "fedavg-nc", "llcg"),
    # ours-full plays CAGNET's role (full batch); ours-secure: ours with --secure
    "table4": ("ours-full", "fedavg", "ours", "ours-secure"),
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
