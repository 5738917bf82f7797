"""FedGCN under mpirun (docs/algorithms.md) on the toy graph: at 3 clients the 2-hop run's saved
logits are those of its saved model on the whole graph, and the round's bytes are in the first
epoch's record and in final.json; at 2 clients --secure trains as the plain run does. The
round's rows themselves are checked without mpirun (tests/unit/mpifgl/methods/test_fedgcn.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.mpi import run_mpi
from tests.helpers.runs import TINY, TRAIN, check_run_dir, metrics, run_ok

ROUND_KEYS = ("pretrain_bytes_sent", "pretrain_bytes_received", "pretrain_seconds")


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("round_norm", ["none", "sym"])
def test_two_hop_logits_are_the_saved_model_on_the_whole_graph(toy_graph, toy_shards, tmp_path,
                                                               round_norm):
    """The first layer's input is the round's (A + I) X, or with --round-norm sym
    D~^-1/2 (A + I) D~^-1/2 X."""
    run = tmp_path / "fedgcn"
    run_ok(run_mpi(4, TRAIN + ["--algo", "fedgcn", "--shards", str(toy_shards(3)), "--epochs",
                               "3", "--dtype", "float64", "--round-norm", round_norm,
                               "--out", str(run), *TINY], timeout=240))
    weights = check_run_dir(run, toy_graph.num_nodes, toy_graph.num_classes, 3)
    assert json.loads((run / "config.json").read_text())["hops"] == 2
    records, final = metrics(run), json.loads((run / "final.json").read_text())
    assert all(key in records[0] and key not in records[1] for key in ROUND_KEYS)
    sent, received = records[0]["pretrain_bytes_sent"], records[0]["pretrain_bytes_received"]
    assert len(sent) == 4 and min(sent[1:]) > 0 and min(received[1:]) > 0
    assert sent == final["pretrain_bytes_sent"] and received == final["pretrain_bytes_received"]
    # the server's download is every client's upload (Gatherv), once
    assert received[0] >= sum(sent[1:]) - 4096
    # Linear on the round's rows, ReLU, the GCN layer over the whole graph with its degrees
    adjacency = toy_graph.adj.toarray() + np.eye(toy_graph.num_nodes)
    scale = 1 / np.sqrt(adjacency.sum(axis=1))
    w = {name: value.numpy() for name, value in weights.items()}
    rows = adjacency if round_norm == "none" else scale[:, None] * adjacency * scale[None, :]
    hidden = np.maximum(rows @ toy_graph.x.astype(np.float64) @ w["first.weight"].T
                        + w["first.bias"], 0)
    expected = (scale[:, None] * adjacency * scale[None, :]) @ hidden @ \
        w["layers.0.lin.weight"].T + w["layers.0.bias"]
    assert np.allclose(np.load(run / "logits.npy"), expected, atol=1e-10, rtol=0)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_secure_trains_as_the_plain_run(toy_graph, toy_shards, tmp_path):
    """The masked round and masked averages: the same losses and logits to fixed-point
    precision, at 2 clients."""
    common = TRAIN + ["--algo", "fedgcn", "--shards", str(toy_shards(2)), "--epochs", "3",
                      "--dtype", "float64", *TINY]
    for name, extra in (("plain", []), ("secure", ["--secure"])):
        run_ok(run_mpi(3, common + ["--out", str(tmp_path / name), *extra], timeout=240))
    plain, masked = metrics(tmp_path / "plain"), metrics(tmp_path / "secure")
    assert np.allclose([r["loss"] for r in masked], [r["loss"] for r in plain], atol=1e-9)
    assert np.allclose(np.load(tmp_path / "secure" / "logits.npy"),
                       np.load(tmp_path / "plain" / "logits.npy"), atol=1e-9, rtol=0)
    assert masked[0]["pretrain_bytes_sent"][1] > 0
    for name in ("plain", "secure"):
        check_run_dir(tmp_path / name, toy_graph.num_nodes, toy_graph.num_classes, 3)
    assert torch.load(tmp_path / "secure" / "model.pt").keys() == \
        torch.load(tmp_path / "plain" / "model.pt").keys()
