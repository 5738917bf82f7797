"""Tiers, the subprocess guard, and the fixtures every tier shares.

Tiers by folder: tests/unit (plain pytest, no subprocess), tests/mpi (real mpirun, marker
``mpi``), tests/e2e (programs run end to end, marker ``e2e``), tests/slurm (the job scripts and a
private SLURM, marker ``slurm``), tests/gpu (CUDA, marker ``gpu``; skipped with the reason where
torch sees no GPU), tests/multinode (mpirun and SLURM over namespace hosts, marker ``multinode``;
skipped with the reason where network namespaces cannot be made). A test outside those folders that starts a subprocess needs one
of the markers itself; without it, ``subprocess.Popen`` and ``os.system`` raise.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import require_shared_data
from tests.helpers.graphs import Graph, random_graph, random_parts, write_shards
from tests.helpers.tiny_fs import mount_tmpfs, unmount

TESTS = Path(__file__).resolve().parent
SUBPROCESS_MARKERS = ("mpi", "e2e", "slurm", "gpu", "multinode")
MARKER_OF_FOLDER = {TESTS / "mpi": "mpi", TESTS / "e2e": "e2e", TESTS / "slurm": "slurm",
                    TESTS / "gpu": "gpu", TESTS / "multinode": "multinode"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark every test by its folder, then refuse a subprocess test without a hard timeout."""
    for item in items:
        path = Path(str(item.path)).resolve()
        for folder, marker in MARKER_OF_FOLDER.items():
            if folder in path.parents:
                item.add_marker(marker)
    untimed = [item.nodeid for item in items
               if any(item.get_closest_marker(m) for m in SUBPROCESS_MARKERS)
               and item.get_closest_marker("timeout") is None]
    if untimed:
        raise pytest.UsageError("these mpi/e2e/slurm/gpu/multinode tests need @pytest.mark.timeout(seconds): "
                                + ", ".join(untimed))


class UnmarkedSubprocess(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def no_subprocess_in_unmarked_tests(request, monkeypatch):
    """An unmarked test runs in-process only: starting a program there is an error that names
    the markers, so the fast tier stays fast and a subprocess test cannot hide in it."""
    if any(request.node.get_closest_marker(m) for m in SUBPROCESS_MARKERS):
        return

    def refuse(*args, **kwargs):
        command = args[0] if args else kwargs.get("args")
        raise UnmarkedSubprocess(
            f"{request.node.nodeid} starts a subprocess ({command!r}) but has none of the "
            f"markers {', '.join(SUBPROCESS_MARKERS)}: mark it (or move it to tests/mpi, "
            f"tests/e2e, tests/slurm or tests/multinode) with a pytest.mark.timeout")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)


@pytest.fixture(scope="session", autouse=True)
def matplotlib_fonts() -> None:
    """matplotlib's font cache, built here on purpose, once per session, before any test's
    subprocess guard: where it was never built (a fresh HOME, CI) matplotlib runs ``fc-list``
    the first time it draws text, and ``import igraph`` (data_prep's louvain) loads its font
    manager too; so every session builds it first."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401  (loads the cache, or builds it with fc-list)


@pytest.fixture
def tiny_fs(tmp_path: Path, request: pytest.FixtureRequest):
    """Factory: a real tmpfs of ``size_bytes`` mounted in tmp_path, unmounted after the test;
    the test is skipped where mounting is refused (not root, no CAP_SYS_ADMIN). Tests using it
    carry the marker ``needs_mount``."""
    if request.node.get_closest_marker("needs_mount") is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses tiny_fs: mark it needs_mount")
    mounted: list[Path] = []

    def make(size_bytes: int, name: str = "fs") -> Path:
        target = tmp_path / name
        target.mkdir()
        try:
            mount_tmpfs(target, size_bytes)
        except OSError as exc:
            pytest.skip(f"cannot mount a tmpfs here ({exc.strerror}): a full file system "
                        f"needs root with CAP_SYS_ADMIN")
        mounted.append(target)
        return target

    yield make
    for target in mounted:
        unmount(target)


def load_planetoid_copy(name: str, tmp: Path) -> Graph:
    """A Planetoid dataset loaded from a temporary copy (PyG writes processed/ next to raw/)."""
    shutil.copytree(require_shared_data(f"Planetoid/{name}"), tmp / name)
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
    """Cora from ../shared/data (e2e tests only: a missing copy fails them)."""
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


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data_prep's cache (MPIFGL_CACHE) inside tmp_path: no test writes to the user's cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MPIFGL_CACHE", str(cache))
    return cache


@pytest.fixture
def one_torch_thread():
    """Ranks that are threads (tests/helpers/thread_comm.py): one intra-op thread each, as
    under an oversubscribed mpirun."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def program(monkeypatch, capsys):
    """``python -m mpifgl.train ARGS`` in this process: (exit status, its stderr lines). The
    signal handlers it installs are put back afterwards."""
    from mpifgl import train
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def run(*argv) -> tuple[int, list[str]]:
        capsys.readouterr()
        status = train.main([str(a) for a in argv])
        return status, capsys.readouterr().err.strip().splitlines()

    yield run
    for signum, handler in saved.items():
        signal.signal(signum, handler)
