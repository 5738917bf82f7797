"""Shared fixtures: small graphs written as shards, real datasets copied out of ../shared/data."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
SHARED_DATA = TESTS.parents[1] / "shared" / "data"

from graphs import Graph, random_graph, random_parts, write_shards  # noqa: E402


def load_planetoid_copy(name: str, tmp: Path) -> Graph:
    """A Planetoid dataset loaded from a temporary copy (PyG writes processed/ next to raw/)."""
    source = SHARED_DATA / "Planetoid" / name
    if not source.is_dir():
        pytest.skip(f"{source} not present (offline datasets live in ../shared/data)")
    shutil.copytree(source, tmp / name)
    from torch_geometric.datasets import Planetoid
    import scipy.sparse as sp
    data = Planetoid(str(tmp), name, split="full")[0]
    n = data.num_nodes
    edge = data.edge_index.numpy()
    adj = sp.coo_matrix((np.ones(edge.shape[1], np.float32), (edge[0], edge[1])), shape=(n, n))
    adj = (adj.tocsr() > 0).astype(np.float32).tocsr()
    adj.setdiag(0)
    adj.eliminate_zeros()
    return Graph(adj, data.x.numpy().astype(np.float32), data.y.numpy().astype(np.int64),
                 data.train_mask.numpy(), data.val_mask.numpy(), data.test_mask.numpy())


@pytest.fixture(scope="session")
def cora_graph(tmp_path_factory) -> Graph:
    return load_planetoid_copy("Cora", tmp_path_factory.mktemp("planetoid"))


@pytest.fixture(scope="session")
def toy_graph() -> Graph:
    return random_graph(n=60, avg_degree=5, d=7, classes=3, seed=11, isolated=2)


@pytest.fixture
def toy_shards(tmp_path, toy_graph):
    """Factory: toy graph split over m clients -> shard directory."""
    def make(num_clients: int, seed: int = 0) -> Path:
        return write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed),
                            tmp_path / f"toy-{num_clients}-{seed}")
    return make
