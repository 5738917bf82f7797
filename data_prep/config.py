"""Typed configuration of one data_prep run. CLI flags are generated from these fields
(``fgl_common.cli``, used by ``data_prep.__main__``), so each option has exactly one spelling and
one documented default."""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from fgl_common.cli import check_finite, option

from .catalog import KNOWN_DATASETS, normalise_dataset_name

PARTITION_METHODS = ("random", "label-skew", "metis", "dirichlet", "louvain")
FILE_PARTITION = "file:"  # --partition file:PATH, the client of every node read from PATH
SPLIT_ORDERS = ("class", "popularity")


@dataclass(frozen=True)
class SyntheticConfig:
    """Stochastic-block-model style graph with class-dependent features (dataset ``synthetic``)."""

    nodes: int = option(10_000, "number of nodes")
    avg_degree: float = option(10.0, "average degree; the graph gets round(nodes * avg_degree / 2) "
                                     "undirected edges")
    edges: int | None = option(None, "exact number of undirected edges (overrides "
                                     "--syn-avg-degree)")
    classes: int = option(5, "number of classes (balanced sizes unless --syn-class-skew > 0)")
    features: int = option(32, "feature dimension")
    homophily: float = option(0.8, "fraction of edges whose two ends share a class (edge "
                                   "homophily), in [0, 1]")
    feature_signal: float = option(1.0, "scale of the per-class mean added to unit Gaussian "
                                        "noise in the features")
    class_skew: float = option(0.0, "Zipf exponent of the class sizes: class k gets a share "
                                    "proportional to (k+1)^-skew (0: balanced; 1: the largest of "
                                    "47 classes holds 22%, the smallest 0.5%)")
    degree_skew: float = option(0.0, "sigma of the log-normal node weights edge ends are drawn in "
                                     "proportion to (0: uniform ends, Poisson degrees; 1: a heavy "
                                     "tail of hubs), in [0, 2]")
    label_noise: float = option(0.0, "fraction of nodes whose label is replaced, after edges and "
                                     "features are drawn from their class, by the label of a "
                                     "random node (ambiguous categories as in ogbn-products); "
                                     "caps the attainable accuracy, in [0, 1]")
    split: tuple[float, ...] = option((0.6, 0.2), "train,val fractions of the nodes inside every "
                                                  "class, the rest is test (ogbn-products: "
                                                  "0.0803,0.0161; Reddit: 0.6586,0.1023)")
    split_by: str = option("class", "how the --syn-split fractions are drawn: 'class' at random "
                                    "inside every class; 'popularity' by degree, the best "
                                    "connected nodes to train, the next to val, the rest to test "
                                    "(ogbn-products' split by sales rank: a train/test shift)",
                           choices=SPLIT_ORDERS)
    seed: int | None = option(None, "seed of the generator (default: --seed), so one graph can be "
                                    "partitioned with several seeds")

    @property
    def num_edges(self) -> int:
        if self.edges is not None:
            return int(self.edges)
        return int(round(self.nodes * self.avg_degree / 2))

    def validate(self) -> None:
        check_finite(self, "syn-")
        n = self.nodes
        if n < 1:
            raise ValueError(f"--syn-nodes must be >= 1, got {n}")
        if self.classes < 1 or self.classes > n:
            raise ValueError(f"--syn-classes must be in 1..{n} (--syn-nodes), got {self.classes}")
        if self.features < 1:
            raise ValueError(f"--syn-features must be >= 1, got {self.features}")
        if not 0.0 <= self.homophily <= 1.0:
            raise ValueError(f"--syn-homophily must be in [0, 1], got {self.homophily}")
        if self.homophily < 1.0 and self.classes < 2 and self.num_edges > 0:
            raise ValueError(f"--syn-homophily {self.homophily} < 1 needs inter-class edges, "
                             f"so --syn-classes must be >= 2 (got {self.classes})")
        if self.class_skew < 0:
            raise ValueError(f"--syn-class-skew must be >= 0, got {self.class_skew}")
        if not 0.0 <= self.degree_skew <= 2.0:
            raise ValueError(f"--syn-degree-skew must be in [0, 2], got {self.degree_skew}")
        if not 0.0 <= self.label_noise <= 1.0:
            raise ValueError(f"--syn-label-noise must be in [0, 1], got {self.label_noise}")
        if (len(self.split) != 2 or min(self.split) < 0
                or sum(self.split) > 1 + 1e-9):
            raise ValueError(f"--syn-split must be two fractions TRAIN,VAL >= 0 with "
                             f"TRAIN + VAL <= 1 (the rest is test), got "
                             f"{','.join(map(str, self.split))}")
        if self.split_by not in SPLIT_ORDERS:
            raise ValueError(f"--syn-split-by must be one of {', '.join(SPLIT_ORDERS)}, got "
                             f"{self.split_by!r}")
        if self.avg_degree < 0:
            raise ValueError(f"--syn-avg-degree must be >= 0, got {self.avg_degree}")
        if self.edges is not None and self.edges < 0:
            raise ValueError(f"--syn-edges must be >= 0, got {self.edges}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"--syn-seed must be >= 0, got {self.seed}")
        # Rejection-free sampling of distinct pairs slows down near a complete graph; half of
        # all pairs is far beyond any graph this tool is meant for.
        max_edges = n * (n - 1) // 4
        if self.num_edges > max_edges:
            raise ValueError(f"synthetic graph with {n} nodes: {self.num_edges} edges requested "
                             f"(--syn-edges or --syn-nodes * --syn-avg-degree / 2), at most "
                             f"{max_edges} (half of all {n * (n - 1) // 2} node pairs) supported")

    @property
    def fractions(self) -> tuple[float, float, float]:
        """train, val, test fractions of the split."""
        train, val = self.split
        return float(train), float(val), max(0.0, 1.0 - float(train) - float(val))

    def as_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}


DEFAULT_SPLIT = SyntheticConfig().split
DEFAULT_SPLIT_BY = SyntheticConfig().split_by


@dataclass(frozen=True)
class PartitionConfig:
    """How nodes are split over clients."""

    method: str = option("random", " | ".join(PARTITION_METHODS) + f" | {FILE_PARTITION}PATH: "
                                   "random = equal sizes, the paper's setting; label-skew = "
                                   "non-iid; metis = few cut edges; dirichlet = FedGCN's label "
                                   "Dirichlet split (--beta); louvain = FedSage+'s communities; "
                                   f"{FILE_PARTITION}PATH = the client of every node, one id per "
                                   "node in node order (.npy or text)",
                         flag="--partition")
    favoured_classes: int = option(2, "label-skew: classes per client whose nodes get "
                                      "--skew-factor times the sampling weight")
    skew_factor: float = option(10.0, "label-skew: weight of a favoured class relative to the "
                                      "others (the paper's 'ten times')")
    beta: float = option(1.0, "dirichlet: concentration of every class's Dirichlet draw over the "
                              "clients (small: each class on few clients; 10000: about iid)")
    min_client_nodes: int = option(10, "dirichlet: the draw is repeated until every client holds "
                                       "at least this many nodes (FedGCN's 10)")
    louvain_delta: int = option(20, "louvain: FedSage+'s delta: communities are cut to at most "
                                    "n/M - delta nodes and a client takes a piece only while it "
                                    "stays below n/M + delta")

    @property
    def kind(self) -> str:
        """The method's name without a file path: what the manifest and the shards record."""
        return "file" if self.method.startswith(FILE_PARTITION) else self.method

    @property
    def file(self) -> Path | None:
        """PATH of --partition file:PATH, else None."""
        if not self.method.startswith(FILE_PARTITION):
            return None
        return Path(self.method[len(FILE_PARTITION):]).expanduser()

    def validate(self, num_clients: int, num_classes: int | None = None,
                 dataset: str = "the dataset") -> None:
        """ValueError naming the flag for a value that makes the partition meaningless: one
        that turns label-skew into an iid split; ``num_classes`` where known (the catalog's,
        then the loaded graph's: ``check_classes``)."""
        check_finite(self)
        if self.method not in PARTITION_METHODS and not (
                self.method.startswith(FILE_PARTITION) and self.method != FILE_PARTITION):
            raise ValueError(f"unknown --partition {self.method!r}; choose one of "
                             f"{', '.join(PARTITION_METHODS)} or {FILE_PARTITION}PATH")
        if self.method == "dirichlet":
            if not self.beta > 0:
                raise ValueError(f"--beta must be > 0, got {self.beta}")
            if self.min_client_nodes < 1:
                raise ValueError(f"--min-client-nodes must be >= 1, got {self.min_client_nodes}")
        if self.method == "louvain" and self.louvain_delta < 0:
            raise ValueError(f"--louvain-delta must be >= 0, got {self.louvain_delta}")
        if self.method == "label-skew":
            if self.favoured_classes < 1:
                raise ValueError(f"--favoured-classes must be >= 1, got {self.favoured_classes}")
            if not self.skew_factor > 1.0:
                raise ValueError(f"--skew-factor must be > 1, got {self.skew_factor}: a favoured "
                                 f"class of weight {self.skew_factor:g} is drawn no more often "
                                 f"than the others (an iid split is --partition random)")
            if num_classes is not None:
                self.check_classes(num_classes, dataset)

    def check_classes(self, num_classes: int, dataset: str) -> None:
        """label-skew needs a class left unfavoured by every client: favouring them all draws
        them all alike (an iid split)."""
        if self.method == "label-skew" and self.favoured_classes >= num_classes:
            expected = (f"in 1..{num_classes - 1}" if num_classes > 1
                        else "a dataset of 2 classes or more")
            raise ValueError(f"--favoured-classes must be {expected} for the {num_classes} "
                             f"classes of {dataset}, got {self.favoured_classes}: a client that "
                             f"favours every class draws them all alike, an iid split (that is "
                             f"--partition random)")

    def check_knobs_given(self, explicit: set[str]) -> None:
        """ValueError for a flag given (``explicit``: the destinations) that only another
        --partition reads: it would be ignored without a word."""
        stray = {f"--{name.replace('_', '-')}": method for name, method in KNOB_METHOD.items()
                 if name in explicit and method != self.method}
        if stray:
            readers = " / ".join(sorted(set(stray.values())))
            raise ValueError(f"{', '.join(stray)} given with --partition {self.method}, which "
                             f"does not read {'it' if len(stray) == 1 else 'them'} (--partition "
                             f"{readers} does)")


# which --partition reads each knob of PartitionConfig
KNOB_METHOD = {"favoured_classes": "label-skew", "skew_factor": "label-skew"}


def default_cache_dir() -> Path:
    """Env MPIFGL_CACHE, else ~/.cache/mpifgl: copies of raw folders, default shard dirs."""
    env = os.environ.get("MPIFGL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mpifgl"


@dataclass(frozen=True)
class PrepConfig:
    """One run: dataset -> split -> partition -> shards in ``out``."""

    num_clients: int = option(MISSING, "number of clients M", required=True)
    out: Path = option(MISSING, "shard directory to create", required=True)
    # exactly one of dataset and graph
    dataset: str | None = option(None, "a dataset of the catalog, one of: "
                                       + ", ".join(KNOWN_DATASETS) + " (or --graph)")
    graph: Path | None = option(None, "your own graph instead of --dataset: an .npz, a .pt "
                                      "(torch.save of a PyG Data or a dict of tensors) or a "
                                      "folder in OGB's node-property layout (docs/data_prep.md)")
    graph_name: str | None = option(None, "--graph: the dataset name the manifest and the run "
                                          "directories carry (default: the file's stem)")
    partition: PartitionConfig = field(default_factory=PartitionConfig)  # flags of its own
    seed: int = option(0, "seed of the split (when not official), partition and synthetic graph")
    data_root: Path | None = option(None, "folder with raw files in PyG layout (default: env "
                                          "MPIFGL_DATA_ROOT, else ../shared/data next to the "
                                          "checkout, else ~/.cache/mpifgl/data)")
    force: bool = option(False, "replace an existing --out (after the new one is written and "
                                "verified)")
    download: bool = option(False, "allow PyG/OGB to download missing raw files into --data-root")
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)  # the --syn-* flags
    cache_dir: Path | None = option(None, "scratch for copies of raw folders (default: env "
                                          "MPIFGL_CACHE, else ~/.cache/mpifgl)")
    show_progress: bool = option(True, "print nothing on success (no progress, no summary, no "
                                       "loader chatter); errors are still printed",
                                 flag="--quiet")

    def validate(self) -> None:
        if (self.dataset is None) == (self.graph is None):
            raise ValueError("give --dataset NAME or --graph PATH, not both" if self.graph
                             else "one of --dataset NAME or --graph PATH is required")
        if self.dataset is not None:
            normalise_dataset_name(self.dataset)  # raises with the list of known names
        if self.num_clients < 1:
            raise ValueError(f"--num-clients must be >= 1, got {self.num_clients}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.graph is not None:
            self.partition.validate(self.num_clients)  # its classes and nodes: once it is read
            return
        name = normalise_dataset_name(self.dataset)
        if name == "synthetic":
            self.synthetic.validate()
            known_nodes, known_classes = self.synthetic.nodes, self.synthetic.classes
        else:
            known_nodes, known_classes = (KNOWN_DATASETS[name].num_nodes,
                                          KNOWN_DATASETS[name].num_classes)
        self.partition.validate(self.num_clients, known_classes, name)
        if known_nodes is not None and self.num_clients > known_nodes:
            raise ValueError(f"--num-clients {self.num_clients} exceeds the {known_nodes} nodes "
                             f"of {name}: every client needs at least one node")
