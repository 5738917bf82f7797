"""The distributed baselines under mpirun (docs/algorithms.md) on the toy graph: the run
directory and the exactness claims: bns with p = 1 == ours --sampling none; fedavg with one
client == centralized full batch; fedavg-nc collects its neighbours and resumes exactly; llcg
at 2 and 3 clients (its rounds against an explicit loop: tests/unit/mpifgl/methods/test_llcg.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import MPI_SCRIPTS, run_mpi
from tests.helpers.runs import (TINY, TRAIN, check_run_dir, fedavg_one_client_equals_centralized,
                                metrics, run_ok)
PROBE_NC = str(MPI_SCRIPTS / "probe_fedavg_nc.py")


@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_bns_with_p1_equals_ours_full(toy_graph, toy_shards, tmp_path):
    shard_dir = toy_shards(2)
    common = ["--shards", str(shard_dir), "--epochs", "4", "--dtype", "float64", *TINY]
    run_ok(run_mpi(3, TRAIN + common + ["--algo", "bns", "--boundary-p", "1",
                                       "--out", str(tmp_path / "bns")], timeout=240))
    run_ok(run_mpi(3, TRAIN + common + ["--algo", "ours", "--sampling", "none",
                                        "--out", str(tmp_path / "ours")], timeout=240))
    check_run_dir(tmp_path / "bns", toy_graph.num_nodes, toy_graph.num_classes, 4)
    assert json.loads((tmp_path / "bns" / "config.json").read_text())["steps_per_epoch"] == 1
    bns, ours = metrics(tmp_path / "bns"), metrics(tmp_path / "ours")
    assert np.allclose([r["loss"] for r in bns], [r["loss"] for r in ours], atol=1e-6, rtol=0)
    assert np.allclose(np.load(tmp_path / "bns" / "logits.npy"),
                       np.load(tmp_path / "ours" / "logits.npy"), atol=1e-6, rtol=0)


@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_fedavg_one_client_equals_centralized(toy_graph, toy_shards, tmp_path):
    fedavg_one_client_equals_centralized(toy_graph, toy_shards(1), tmp_path)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_fedavg_nc_collects_neighbours_with_owners_features(toy_graph, tmp_path):
    parts = random_parts(toy_graph.num_nodes, 3, seed=0)
    shard_dir = write_shards(toy_graph, parts, tmp_path / "shards")
    out = tmp_path / "nc.npz"
    run_ok(run_mpi(4, [PROBE_NC, str(shard_dir), str(out), "0.2"], timeout=240))
    results = np.load(out)
    members = [np.flatnonzero(parts == j) for j in range(3)]
    client_ordered_to_global = np.concatenate(members)
    adjacency = toy_graph.adj.toarray()
    for i in range(3):
        collected, candidates = results[f"collected_{i}"], results[f"candidates_{i}"]
        assert collected.shape[0] == round(0.2 * candidates.shape[0]) > 0
        assert len(set(collected.tolist())) == collected.shape[0]
        assert set(collected.tolist()) <= set(candidates.tolist())
        added = client_ordered_to_global[collected]
        assert np.all(parts[added] != i), "collected one of its own nodes"
        assert np.array_equal(results[f"added_x_{i}"], toy_graph.x[added])
        own = members[i]
        local = results[f"adjacency_{i}"]
        n_i = own.shape[0]
        assert np.array_equal(local[:n_i, :n_i], adjacency[np.ix_(own, own)])
        assert np.array_equal(local[:n_i, n_i:], adjacency[np.ix_(own, added)])
        assert not local[n_i:, n_i:].any(), "edges among added nodes are unknown to client i"
        assert np.array_equal(results[f"degree_{i}"], local.sum(axis=1))


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_fedavg_nc_end_to_end_and_resume(toy_graph, toy_shards, tmp_path):
    """2 clients, 2 local epochs; a run resumed at epoch 2 continues bit for bit (every client's
    own Adam state is in the checkpoint)."""
    shard_dir = toy_shards(2)
    common = ["--shards", str(shard_dir), "--algo", "fedavg-nc", "--local-epochs", "2", *TINY]
    check_resume_is_exact(3, common, tmp_path, timeout=120)
    check_run_dir(tmp_path / "straight", toy_graph.num_nodes, toy_graph.num_classes, 4)


def check_resume_is_exact(ranks: int, common: list[str], tmp_path, timeout: float) -> None:
    """4 epochs straight, and 2 epochs (checkpoint at 2) resumed into a new directory up to 4
    (a finished run goes on in a new directory): the same losses and logits, bit for bit."""
    run_ok(run_mpi(ranks, TRAIN + common + ["--epochs", "4", "--out",
                                            str(tmp_path / "straight")], timeout=timeout))
    run_ok(run_mpi(ranks, TRAIN + common + ["--epochs", "2", "--checkpoint-every", "2",
                                            "--out", str(tmp_path / "first")], timeout=timeout))
    run_ok(run_mpi(ranks, TRAIN + ["--resume", str(tmp_path / "first"), "--out",
                                   str(tmp_path / "resumed"), "--epochs", "4", "--save-logits"],
                   timeout=timeout))
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert [r["loss"] for r in straight] == [r["loss"] for r in resumed]
    assert np.array_equal(np.load(tmp_path / "straight" / "logits.npy"),
                          np.load(tmp_path / "resumed" / "logits.npy"))


def llcg_phase_bytes(run, clients: int, parameters: int) -> tuple[list[dict], dict]:
    """Each phase's bytes per rank (sent + received) in every epoch of an LLCG run, and what
    they must be: up, float64 weights + Adam moments + step + weighted loss + weight per client
    (one Reduce); down, float64 weights + loss per client (one Scatterv); nothing else moves."""
    up, down = (3 * parameters + 3) * 8, (parameters + 1) * 8
    expected = {"local": [0] * (clients + 1), "correction": [0] * (clients + 1),
                "average": [up * clients] + [up] * clients,
                "broadcast": [down * clients] + [down] * clients}
    found = [{name: phase["bytes"] for name, phase in r["phases"].items()} for r in metrics(run)]
    return found, expected


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_llcg_server_holds_the_whole_graph_and_evaluates_it(toy_graph, toy_shards, tmp_path):
    """3 clients: the start line and final.json say the server holds the whole graph; the
    server's logits of every node give the scores; each phase moves exactly its bytes."""
    shard_dir = toy_shards(3)
    run = tmp_path / "llcg"
    done = run_ok(run_mpi(4, TRAIN + ["--shards", str(shard_dir), "--algo", "llcg", "--epochs",
                                      "3", "--llcg-local-steps", "4", "--llcg-rho", "1.1",
                                      "--batch-size", "16", "--out", str(run), *TINY],
                          timeout=240))
    assert (f"over 3 clients, the server holding the whole graph ({toy_graph.num_nodes} nodes, "
            f"{toy_graph.adj.nnz} directed edges, features and labels)") in done.stdout
    weights = check_run_dir(run, toy_graph.num_nodes, toy_graph.num_classes, 3)
    assert json.loads((run / "final.json").read_text())["server_holds_whole_graph"] is True
    predicted = np.load(run / "logits.npy").argmax(axis=1)  # the final model's, at the server
    last = metrics(run)[-1]
    for split in ("train", "val", "test"):
        mask = getattr(toy_graph, f"{split}_mask")
        assert last[f"{split}_micro_f1"] == pytest.approx(
            float((predicted[mask] == toy_graph.y[mask]).mean()), abs=1e-12), split
    found, expected = llcg_phase_bytes(run, 3, sum(w.numel() for w in weights.values()))
    assert found == [expected] * 3


@pytest.mark.mpi
@pytest.mark.timeout(800)
def test_llcg_two_clients_resume_exactly(toy_shards, tmp_path):
    """A run resumed at round 2 continues bit for bit: every client's Adam, the server's and the
    rho schedule's round are in the checkpoint."""
    shard_dir = toy_shards(2)
    common = ["--shards", str(shard_dir), "--algo", "llcg", "--llcg-local-steps", "3",
              "--llcg-rho", "1.5", "--llcg-server-steps", "2", "--batch-size", "12", *TINY]
    check_resume_is_exact(3, common, tmp_path, timeout=240)
