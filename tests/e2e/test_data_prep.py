"""python -m data_prep end to end: real datasets round trip, no traceback for missing files,
--quiet prints nothing, a killed run leaves nothing the next one keeps, a user's own graph
becomes shards the main job trains on."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from data_prep.config import PrepConfig
from data_prep.datasets import load_dataset
from data_prep.verify import verify_shard_dir
from tests.helpers import SHARED_DATA, require_shared_data
from tests.helpers.data_prep_fixtures import (SMALL_SYN, check_shards_hold_the_dataset, copy_raw,
                                              edge_set, load_all, run_cli)
from tests.helpers.mpi import REPO, mpi_env, run_mpi


@pytest.mark.timeout(180)
def test_kill_9_during_data_prep_leaves_nothing_the_next_run_keeps(tmp_path):
    command = [sys.executable, "-m", "data_prep", "--dataset", "synthetic", "--syn-nodes",
               "400000", "--syn-avg-degree", "4", "--num-clients", "4", "--out",
               str(tmp_path / "shards"), "--quiet"]
    env = {**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen(command, env=env, cwd=REPO)
    try:
        for _ in range(600):
            if list(tmp_path.glob(".shards.partial-*")) or process.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        assert list(tmp_path.glob(".shards.partial-*")), "killed before writing shards"
        process.kill()
    finally:
        process.wait(timeout=30)
    small = [sys.executable, "-m", "data_prep", *SMALL_SYN, "--num-clients", "2", "--out",
             str(tmp_path / "shards"), "--quiet", "--force"]
    subprocess.run(small, env=env, cwd=REPO, check=True, timeout=120)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.timeout(300)
def test_data_prep_quiet_prints_nothing(tmp_path):
    require_shared_data("Planetoid/Cora")
    done = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "cora",
                           "--num-clients", "2", "--data-root", str(SHARED_DATA), "--out",
                           str(tmp_path / "shards"), "--quiet"],
                          env={**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


@pytest.mark.timeout(60)
def test_missing_raw_files_subprocess_has_no_traceback(tmp_path):
    """The real command, as a user runs it: message, exit 2, within seconds, no network."""
    env = {"PATH": "/usr/bin:/bin", "MPIFGL_CACHE": str(tmp_path / "cache"),
           "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "data_prep", "--dataset", "pubmed", "--num-clients", "8",
         "--data-root", str(tmp_path), "--out", str(tmp_path / "o")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("data_prep: error: dataset pubmed:")
    assert "ind.pubmed.allx" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("dataset,relative,num_nodes,num_edges", [
    ("cora", "Planetoid/Cora/raw", 2708, 5278),
    ("amazon-computers", "Amazon/Computers/raw", 13752, 245861),
])
@pytest.mark.timeout(300)
def test_real_dataset_round_trip(tmp_path, isolated_cache, capsys, dataset, relative,
                                 num_nodes, num_edges):
    data_root = copy_raw(tmp_path / "data", relative)
    out = tmp_path / "shards"
    status, stdout, stderr = run_cli(capsys, "--dataset", dataset, "--num-clients", 8,
                                     "--data-root", data_root, "--out", out)
    assert status == 0, stderr
    assert "cross-client edges" in stdout and "peak RSS" in stdout  # the summary
    manifest, shards = load_all(out)
    assert manifest["num_nodes"] == num_nodes and manifest["num_edges"] == num_edges
    assert [c["num_nodes"] for c in manifest["clients"]] == \
        [num_nodes // 8 + (i < num_nodes % 8) for i in range(8)]
    assert abs(manifest["cross_edge_fraction"] - (1 - 1 / 8)) < 0.02
    config = PrepConfig(dataset=dataset, num_clients=8, out=out, data_root=data_root,
                        show_progress=False)
    check_shards_hold_the_dataset(config, shards)
    if dataset == "cora":  # official Planetoid "full" split
        assert manifest["split_rule"] == "planetoid-full"
        assert (manifest["num_train"], manifest["num_val"], manifest["num_test"]) == \
            (1208, 500, 1000)
    else:
        assert manifest["split_rule"].startswith("stratified-60/20/20")
    assert not list((tmp_path / "data").rglob("processed"))  # raw copy left untouched
    assert verify_shard_dir(out).ok


@pytest.mark.timeout(120)
def test_cora_matches_pyg_edges(tmp_path, isolated_cache):
    """Independent check of the loader: same edge set as PyG's own edge_index."""
    from torch_geometric.datasets import Planetoid

    data_root = copy_raw(tmp_path / "data", "Planetoid/Cora/raw")
    config = PrepConfig(dataset="cora", num_clients=2, out=tmp_path / "o", data_root=data_root,
                        show_progress=False)
    graph = load_dataset(config)
    pyg_copy = copy_raw(tmp_path / "pyg", "Planetoid/Cora/raw")
    data = Planetoid(str(pyg_copy / "Planetoid"), "Cora", split="full")[0]
    pyg_edges = {(int(a), int(b)) for a, b in data.edge_index.t().tolist() if a != b}
    assert edge_set(graph.adjacency) == pyg_edges
    np.testing.assert_array_equal(graph.x, data.x.numpy())
    np.testing.assert_array_equal(graph.y, data.y.numpy())
    np.testing.assert_array_equal(graph.train_mask, data.train_mask.numpy())


@pytest.mark.needs_mount
@pytest.mark.timeout(180)
def test_amazon_computers_onto_a_full_disk_ends_with_one_line(tmp_path, tiny_fs):
    """The case that used to end in a segfault after pages of h5py tracebacks: 8 shards of
    amazon-computers onto a 2 MB file system. Now: one `data_prep: error` line naming the file,
    the free bytes and the bytes needed, exit 2, and the partial output removed."""
    fs = tiny_fs(2 * 2 ** 20)
    env = {**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "amazon-computers",
                           "--num-clients", "8", "--data-root", str(SHARED_DATA), "--out",
                           str(fs / "shards"), "--quiet"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"data_prep: error: {fs / 'shards' / 'client_0.h5'}: No space "
                               f"left on device (the file system has ")
    assert "bytes free, this write needs " in lines[0]
    assert lines[0].endswith("bytes); partial output removed")
    assert list(fs.iterdir()) == []


@pytest.mark.timeout(240)
def test_your_own_graph_becomes_verified_shards_and_trains(tmp_path):
    """The user's path, as programs: an edge list with features and labels in an .npz and the
    same graph as a PyG Data in a .pt, one command each to verified shards (dirichlet and
    louvain clients), and mpirun of the main job trains on them."""
    import torch
    from torch_geometric.data import Data

    rng = np.random.default_rng(0)
    n = 120
    y = np.arange(n) % 3
    src = rng.integers(0, n, 600)
    same_class = 3 * rng.integers(0, n // 3, 600) + y[src]  # most edges inside a class
    dst = np.where(rng.random(600) < 0.8, same_class, rng.integers(0, n, 600))
    arrays = {"edge_index": np.stack([src, dst]),
              "x": (rng.normal(size=(n, 8)) + y[:, None]).astype(np.float32), "y": y}
    np.savez(tmp_path / "mine.npz", **arrays)
    torch.save(Data(**{k: torch.from_numpy(v) for k, v in arrays.items()}), tmp_path / "mine.pt")
    env = {**mpi_env(), "MPIFGL_CACHE": str(tmp_path / "cache")}
    for source, partition in (("mine.npz", ["dirichlet", "--beta", "1", "--min-client-nodes",
                                            "5"]), ("mine.pt", ["louvain"])):
        out = tmp_path / f"shards-{source}"
        done = subprocess.run([sys.executable, "-m", "data_prep", "--graph",
                               str(tmp_path / source), "--num-clients", "2", "--partition",
                               *partition, "--out", str(out)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "edge_index: 600 entries" in done.stdout and "client sizes:" in done.stdout
        assert verify_shard_dir(out).ok  # what `python -m data_prep verify` runs
    run = tmp_path / "run"
    done = run_mpi(3, ["-m", "mpifgl.train", "--shards", str(tmp_path / "shards-mine.npz"),
                       "--epochs", "2", "--hidden", "8", "--out", str(run)], timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads((run / "final.json").read_text())
    assert final["dataset"] == "mine" and 0.0 <= final["test_micro_f1"] <= 1.0
