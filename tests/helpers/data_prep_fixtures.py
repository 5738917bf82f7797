"""Helpers for the data_prep tests (the ``isolated_cache`` fixture lives in tests/conftest.py).

Nothing here touches the network or writes into the shared data folder: raw folders are copied
into tmp_path and the cache (MPIFGL_CACHE) points into tmp_path too."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_prep.__main__ import main
from data_prep.catalog import KNOWN_DATASETS
from fgl_common import shard_format
from tests.helpers import require_shared_data

# Small synthetic graph used by most tests: fast to build, yet with every class on every client.
SMALL_SYN = ["--dataset", "synthetic", "--syn-nodes", "600", "--syn-avg-degree", "8",
             "--syn-classes", "4", "--syn-features", "5"]


def copy_raw(data_root: Path, relative: str) -> Path:
    """Copy one raw folder of the shared data into ``data_root`` (tests never load in place)."""
    shutil.copytree(require_shared_data(relative), data_root / relative)
    return data_root


def run_cli(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    """Run ``python -m data_prep`` in-process; return (exit status, stdout, stderr)."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse usage errors
        status = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def leftovers(parent: Path) -> list[str]:
    """Hidden temporary entries data_prep may have left in ``parent``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def edge_set(adjacency) -> set[tuple[int, int]]:
    coo = adjacency.tocoo()
    return set(zip(coo.row.tolist(), coo.col.tolist()))


def assert_same_graph(nodes: dict, adjacency, graph) -> None:
    """Reassembled shards (``assemble_global_graph``) equal the loaded ``GraphData`` exactly."""
    reference = graph.adjacency.astype(np.float32).tocsr()
    reference.sort_indices()
    rebuilt = adjacency.tocsr()
    rebuilt.sort_indices()
    assert rebuilt.shape == reference.shape
    assert np.array_equal(rebuilt.indptr, reference.indptr)
    assert np.array_equal(rebuilt.indices, reference.indices)
    assert rebuilt.data.max(initial=1) == 1  # no entry stored twice
    np.testing.assert_array_equal(nodes["x"], graph.x)
    np.testing.assert_array_equal(nodes["y"], graph.y)
    for name in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(nodes[name], getattr(graph, name))
    np.testing.assert_array_equal(nodes["degree"], np.diff(graph.adjacency.indptr))


def load_all(shard_dir: Path) -> tuple[dict, list[shard_format.ClientShard]]:
    manifest = shard_format.read_manifest(shard_dir)
    shards = [shard_format.load_client_shard(shard_dir / c["file"]) for c in manifest.clients]
    return manifest.raw, shards


def check_blocks_transposed(shards: list[shard_format.ClientShard]) -> None:
    for i, shard in enumerate(shards):
        assert set(shard.blocks) == {j for j in range(len(shards))
                                     if j in shard.blocks or i in shards[j].blocks}
        for j, block in shard.blocks.items():
            assert (block != shards[j].blocks[i].T).nnz == 0


def check_local_order(shards: list[shard_format.ClientShard]) -> None:
    for shard in shards:
        assert np.all(np.diff(shard.global_id) > 0)  # ascending global ids


def check_shards_hold_the_dataset(config, shards: list[shard_format.ClientShard]) -> None:
    """The shards put together are the dataset ``config`` loads (nodes, splits, edges), their
    cross blocks are each other's transposes, and each holds its nodes in global order."""
    from data_prep.datasets import load_dataset  # loads the dataset's libraries only when used
    nodes, adjacency = shard_format.assemble_global_graph(shards)
    assert_same_graph(nodes, adjacency, load_dataset(config))
    check_blocks_transposed(shards)
    check_local_order(shards)


# -- tiny raw files in OGB's layout ---------------------------------------------------------------
N = 40


def tiny_graph(seed: int = 0):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N, 120)
    dst = rng.integers(0, N, 120)
    return rng, src, dst


def expected_edges(src, dst) -> set[tuple[int, int]]:
    """The directed edge set of an undirected graph without self loops from an edge list."""
    keep = src != dst
    pairs = {(int(a), int(b)) for a, b in zip(src[keep], dst[keep])}
    return pairs | {(b, a) for a, b in pairs}


def write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for row in rows:
            handle.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def make_fake_ogb(data_root: Path, name: str, folder: Path | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Tiny raw files of an ogbn-* dataset in OGB's layout (under data_root/OGB/<name>, or in
    ``folder``) -> (labels, the permutation whose pieces are train, valid, test)."""
    spec = KNOWN_DATASETS[name]
    rng, src, dst = tiny_graph()
    folder = folder or data_root / "OGB" / name.replace("-", "_")
    raw = folder / "raw"
    write_csv_gz(raw / "edge.csv.gz", zip(src, dst))
    write_csv_gz(raw / "node-feat.csv.gz", rng.normal(size=(N, 3)).round(3))
    labels = rng.integers(0, 4, N)
    write_csv_gz(raw / "node-label.csv.gz", labels)
    write_csv_gz(raw / "num-node-list.csv.gz", [N])
    write_csv_gz(raw / "num-edge-list.csv.gz", [len(src)])
    if name == "ogbn-arxiv":
        write_csv_gz(raw / "node_year.csv.gz", rng.integers(2000, 2020, N))
    split_dir = [p for p in spec.raw_files if "/split/" in p][0].split("/split/")[1].split("/")[0]
    perm = rng.permutation(N)
    for part, ids in zip(("train", "valid", "test"), (perm[:20], perm[20:30], perm[30:])):
        write_csv_gz(folder / "split" / split_dir / f"{part}.csv.gz", sorted(ids))
    (folder / "RELEASE_v1.txt").write_text("fake release\n")
    return labels, perm
