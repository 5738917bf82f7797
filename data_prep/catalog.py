"""The datasets data_prep knows: names, sizes, where their raw files live under the data root
and how to obtain them. Plain data: no loader, no numpy, nothing else of data_prep."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's raw files live under the data root and how to obtain them."""

    name: str  # our lowercase, hyphenated name
    family: str  # planetoid, amazon, coauthor, citationfull, actor, heterophilous, reddit, ogb
    loader_name: str  # name passed to the PyG/OGB loader
    copy_dirs: tuple[str, ...]  # folders (relative to data root) copied to the scratch root
    raw_files: tuple[str, ...]  # files that must exist (relative to data root)
    root_dir: str  # loader root, relative to data root
    official_split: str | None  # split rule when the dataset has an official split
    num_nodes: int | None  # known size, to reject --num-clients early
    how_to_obtain: str
    num_classes: int | None = None  # known classes, to reject label-skew knobs early


def _planetoid(name: str, loader_name: str, nodes: int, classes: int) -> DatasetSpec:
    stem = loader_name.lower()
    parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    raw = f"Planetoid/{loader_name}/raw"
    return DatasetSpec(name, "planetoid", loader_name, (raw,),
                       tuple(f"{raw}/ind.{stem}.{p}" for p in parts), "Planetoid",
                       "planetoid-full", nodes,
                       "PyG downloads them from "
                       "https://github.com/kimiyoung/planetoid/raw/master/data", classes)


def _npz(name: str, family: str, folder: str, loader_name: str, raw_subdir: str, filename: str,
         nodes: int, source: str, classes: int) -> DatasetSpec:
    raw = f"{folder}/{raw_subdir}/raw"
    return DatasetSpec(name, family, loader_name, (raw,), (f"{raw}/{filename}",), folder, None,
                       nodes, f"PyG downloads it from {source}", classes)


def _ogb(name: str, split_name: str, extra_node_files: tuple[str, ...], nodes: int,
         classes: int) -> DatasetSpec:
    folder = f"OGB/{name.replace('-', '_')}"
    raw = tuple(f"{folder}/raw/{f}" for f in ("edge.csv.gz", "node-feat.csv.gz",
                                              "node-label.csv.gz", "num-node-list.csv.gz",
                                              "num-edge-list.csv.gz") + extra_node_files)
    split = tuple(f"{folder}/split/{split_name}/{s}.csv.gz" for s in ("train", "valid", "test"))
    short = name.split("-")[1]
    return DatasetSpec(name, "ogb", name, (f"{folder}/raw", f"{folder}/split"),
                       raw + split + (f"{folder}/RELEASE_v1.txt",), "OGB", "ogb-official", nodes,
                       f"OGB downloads http://snap.stanford.edu/ogb/data/nodeproppred/{short}.zip "
                       f"(unzip it as {folder}/ and keep RELEASE_v1.txt)", classes)


_GNN_BENCH = "https://github.com/shchur/gnn-benchmark/raw/master/data/npz/"
_G2G = "https://github.com/abojchevski/graph2gauss/raw/master/data/"
KNOWN_DATASETS: dict[str, DatasetSpec | None] = {
    "cora": _planetoid("cora", "Cora", 2708, 7),
    "citeseer": _planetoid("citeseer", "CiteSeer", 3327, 6),
    "pubmed": _planetoid("pubmed", "PubMed", 19717, 3),
    "amazon-computers": _npz("amazon-computers", "amazon", "Amazon", "Computers", "Computers",
                             "amazon_electronics_computers.npz", 13752, _GNN_BENCH, 10),
    "amazon-photo": _npz("amazon-photo", "amazon", "Amazon", "Photo", "Photo",
                         "amazon_electronics_photo.npz", 7650, _GNN_BENCH, 8),
    "coauthor-cs": _npz("coauthor-cs", "coauthor", "Coauthor", "CS", "CS", "ms_academic_cs.npz",
                        18333, _GNN_BENCH, 15),
    "coauthor-physics": _npz("coauthor-physics", "coauthor", "Coauthor", "Physics", "Physics",
                             "ms_academic_phy.npz", 34493, _GNN_BENCH, 5),
    "cora-ml": _npz("cora-ml", "citationfull", "CitationFull", "Cora_ML", "cora_ml",
                    "cora_ml.npz", 2995, _G2G, 7),
    "dblp": _npz("dblp", "citationfull", "CitationFull", "DBLP", "dblp", "dblp.npz", 17716, _G2G, 4),
    "actor": DatasetSpec(
        "actor", "actor", "Actor", ("Actor/raw",),
        ("Actor/raw/out1_node_feature_label.txt", "Actor/raw/out1_graph_edges.txt")
        + tuple(f"Actor/raw/film_split_0.6_0.2_{i}.npz" for i in range(10)),
        "Actor", None, 7600,
        "PyG downloads them from https://github.com/graphdml-uiuc-jlu/geom-gcn "
        "(new_data/film, splits)", 5),
    "tolokers": _npz("tolokers", "heterophilous", "HeterophilousGraphDataset", "Tolokers",
                     "tolokers", "tolokers.npz", 11758,
                     "https://github.com/yandex-research/heterophilous-graphs/raw/main/data", 2),
    "reddit": DatasetSpec(
        "reddit", "reddit", "Reddit", ("Reddit/raw",),
        ("Reddit/raw/reddit_data.npz", "Reddit/raw/reddit_graph.npz"), "Reddit", "reddit-official",
        232965,
        "PyG downloads https://data.dgl.ai/dataset/reddit.zip and unzips it into Reddit/raw/", 41),
    "ogbn-products": _ogb("ogbn-products", "sales_ranking", (), 2449029, 47),
    "ogbn-arxiv": _ogb("ogbn-arxiv", "time", ("node_year.csv.gz",), 169343, 40),
    "synthetic": None,  # generated, see data_prep.synthetic
}


def normalise_dataset_name(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    if key not in KNOWN_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: "
                         f"{', '.join(KNOWN_DATASETS)}")
    return key
