"""Helpers for the data_prep tests (the ``isolated_cache`` fixture lives in tests/conftest.py).

Nothing here touches the network or writes into the shared data folder: raw folders are copied
into tmp_path and the cache (MPIFGL_CACHE) points into tmp_path too."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from data_prep.__main__ import main
from fgl_common import shard_format
from tests.helpers import require_shared_data

# Small synthetic graph used by most tests: fast (< 0.1 s) yet with every class on every client.
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
