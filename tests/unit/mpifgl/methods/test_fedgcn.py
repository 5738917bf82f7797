"""mpifgl.methods.fedgcn without mpirun (ranks are threads, tests/helpers/thread_comm.py): the
pre-training round's rows are (A + I) [X | 1] of the whole graph for C_k, plain and masked (the
server then receives ring words only); the 2-hop model's own-node logits equal the same model
on the whole graph; --hops 0 equals fedavg with an unweighted mean; the flags' errors. The
mpirun runs are in tests/mpi/test_fedgcn.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph, build_operator
from mpifgl.methods import build_trainer, get_method
from mpifgl.methods.fedavg import client_weight
from mpifgl.methods.fedgcn import pre_training_round
from mpifgl.model import flatten
from mpifgl.secure import SecureSession
from mpifgl.train import USAGE_ERROR, parse_args
from tests.helpers.exactness import TOLERANCE, assert_close
from tests.helpers.graphs import write_shards
from tests.helpers.thread_comm import ThreadWorld

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # ranks are threads
FOUR_ROWS_MB = 4 * 8 * 8 / 2 ** 20  # chunks of four float64 rows of the toy graph's round


def whole_graph_rows(toy_graph) -> np.ndarray:
    """(A + I) [X | 1] over the whole graph, in float64, by global id."""
    z = np.concatenate([toy_graph.x, np.ones((toy_graph.num_nodes, 1))], axis=1)
    return (toy_graph.adj.toarray() + np.eye(toy_graph.num_nodes)) @ z


def client_ordered_ids(shard_dir) -> np.ndarray:
    """Global id of every client-ordered id (clients end to end, each in its local order)."""
    manifest = read_manifest(shard_dir)
    return np.concatenate([ClientGraph.for_rank(shard_dir, manifest, j).global_id
                           for j in range(manifest.num_clients)])


def run_round(shard_dir, hops: int, dtype: torch.dtype, masked: bool, buffer_mb: float,
              norm: str = "none"):
    """Every client's (own global ids, its rows' table, its external neighbours) by client."""
    manifest = read_manifest(shard_dir)

    def body(comm):
        graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
        session = SecureSession.agree(comm) if masked else None
        found = pre_training_round(comm, graph, hops, dtype, int(buffer_mb * 2 ** 20), session,
                                   norm)
        return None if found is None else (graph.global_id, found.table, found.external)

    world = ThreadWorld(manifest.num_clients + 1)
    return world.run(body)[1:], world


@pytest.mark.parametrize("num_clients,hops,buffer_mb", [
    (1, 2, 64.0), (3, 1, 64.0), (3, 2, 64.0), (4, 2, FOUR_ROWS_MB)])
def test_round_rows_are_the_whole_graph_sums_of_every_row_of_c_k(toy_graph, toy_shards,
                                                                  num_clients, hops, buffer_mb):
    """One chunk per exchange, or chunks of four rows."""
    shard_dir = toy_shards(num_clients)
    expected = whole_graph_rows(toy_graph)
    global_of = client_ordered_ids(shard_dir)
    adjacency = toy_graph.adj.toarray()
    results, _ = run_round(shard_dir, hops, torch.float64, False, buffer_mb)
    for k, (own, table, external) in enumerate(results):
        neighbours = np.setdiff1d(np.flatnonzero(adjacency[own].any(axis=0)), own)
        # 2 hops: every one-hop neighbour on another client, in ascending client-ordered id
        assert np.array_equal(np.sort(global_of[external]), neighbours if hops == 2 else [])
        assert np.all(np.diff(external) > 0)
        rows = np.concatenate([own, global_of[external]])
        assert_close(table, expected[rows], TOLERANCE["float64"], f"client {k}")
        # the column of ones: whole-graph degree + 1 of every row
        assert np.array_equal(table[:, -1], adjacency[rows].sum(axis=1) + 1)


@pytest.mark.parametrize("norm", ["row", "sym"])
@pytest.mark.parametrize("num_clients,hops,masked", [(3, 1, False), (3, 2, False), (4, 2, False),
                                                     (3, 2, True)])
def test_weighted_round_rows_are_fedgraphs_norm_type_on_the_whole_graph(toy_graph, toy_shards,
                                                                        num_clients, hops,
                                                                        masked, norm):
    """FedGraph's norm_type from its definition on the whole graph (d~ = degree + 1): row = the
    edge u -> v and the self loop weighted 1 / d~(u), i.e. (A + I) D~^-1 X; sym = D~^-1/2 (A + I)
    D~^-1/2 X; plain and through the masked sums. The ones column stays the degree."""
    shard_dir = toy_shards(num_clients)
    adjacency = toy_graph.adj.toarray().astype(np.float64)
    tilde = adjacency.sum(axis=1) + 1.0
    closed = adjacency + np.eye(toy_graph.num_nodes)
    weighted = closed / tilde[None, :] if norm == "row" else \
        closed / np.sqrt(tilde)[:, None] / np.sqrt(tilde)[None, :]
    expected = weighted @ toy_graph.x.astype(np.float64)
    global_of = client_ordered_ids(shard_dir)
    results, _ = run_round(shard_dir, hops, torch.float64, masked, 64.0, norm)
    for k, (own, table, external) in enumerate(results):
        rows = np.concatenate([own, global_of[external]])
        assert_close(table[:, :-1], expected[rows], TOLERANCE["float64"], f"client {k}")
        assert np.array_equal(table[:, -1], tilde[rows])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_secure_round_gives_the_same_rows_and_the_server_only_ring_words(toy_graph, toy_shards,
                                                                          dtype):
    shard_dir = toy_shards(3)
    torch_dtype = getattr(torch, dtype)
    plain, plain_world = run_round(shard_dir, 2, torch_dtype, False, 64.0)
    masked, world = run_round(shard_dir, 2, torch_dtype, True, 64.0)
    width = toy_graph.x.shape[1] + 1
    for k, ((own, a, ext_a), (_, b, ext_b)) in enumerate(zip(plain, masked)):
        assert np.array_equal(ext_a, ext_b)
        assert_close(b, a, TOLERANCE[dtype], f"masked rows of client {k}")
    # without --secure the server receives float terms; with it, ring words only (and ids)
    assert any(v.dtype.kind == "f" for _, _, v in plain_world.server_received)
    assert all(v.dtype.kind in "ui" for _, _, v in world.server_received)
    # the terms: uniform bytes once each one-chunk exchange's head row (exponent, zeros) is off
    words = [np.ascontiguousarray(v[width:]).view(np.uint8) for kind, _, v in
             world.server_received if kind == "gatherv" and v.dtype.kind == "u" and v.size]
    octets = np.concatenate(words)
    assert octets.size > 4000
    counts = np.bincount(octets, minlength=256)
    chi_square = float(((counts - octets.size / 256) ** 2 / (octets.size / 256)).sum())
    assert chi_square < 347  # 255 degrees of freedom: p = 1e-4


def fedgcn_config(shard_dir, **flags) -> TrainConfig:
    """FedGCN's defaults (the registry's) under ``flags``, as ``mpifgl.train`` resolves them."""
    config = TrainConfig(shards=str(shard_dir), algo="fedgcn", **flags)
    return config.replace(**get_method("fedgcn").default_changes(set(flags), config.layers))


def train_and_predict(shard_dir, config: TrainConfig, rounds: int):
    """``rounds`` rounds, then every rank's (own global ids, own logits) and the server's
    parameters."""
    manifest = read_manifest(shard_dir)

    def body(comm):
        graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
        method = build_trainer(config, comm, graph, manifest.num_classes).method
        for _ in range(rounds):
            method.train_step()
        return graph.global_id, method.full_logits().detach().numpy(), method.model

    return ThreadWorld(manifest.num_clients + 1).run(body)


@pytest.mark.parametrize("backbone", ["gcn", "sage"])
def test_two_hop_own_logits_equal_the_model_on_the_whole_graph(toy_graph, toy_shards, backbone):
    """With the round's whole-graph degrees, no edge between external neighbours is needed: each
    client's own logits are those of the same weights on the whole graph (the program's layer
    on the merged graph; for GCN also written out densely)."""
    shard_dir = toy_shards(3)
    config = fedgcn_config(shard_dir, dtype="float64", backbone=backbone, hidden=8)
    results = train_and_predict(shard_dir, config, rounds=2)
    model = results[0][2].eval()
    ids = np.concatenate([r[0] for r in results[1:]])
    found = np.concatenate([r[1] for r in results[1:]])[np.argsort(ids)]
    assert np.array_equal(np.sort(ids), np.arange(toy_graph.num_nodes))
    assert all(torch.equal(a, b) for r in results[1:]
               for a, b in zip(r[2].parameters(), model.parameters()))  # one averaged model
    rows = torch.from_numpy(whole_graph_rows(toy_graph)[:, :-1])
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(j))
                                 for j in range(manifest.num_clients)])
    order = np.argsort(merged.global_id)  # merged rows are client-ordered
    with torch.no_grad():
        hidden = torch.relu(model.first(rows[merged.global_id]))
        operator = build_operator(merged, backbone, None, None, torch.float64, False)
        expected = model.layers[0](hidden, operator).numpy()[order]
        assert_close(found, expected, TOLERANCE["float64"], f"{backbone} logits")
        if backbone == "gcn":
            adjacency = toy_graph.adj.toarray() + np.eye(toy_graph.num_nodes)
            scale = 1 / np.sqrt(adjacency.sum(axis=1))
            h = torch.relu(model.first(rows)).numpy()
            dense = (scale[:, None] * adjacency * scale[None, :]) @ h @ \
                model.layers[0].lin.weight.numpy().T + model.layers[0].bias.numpy()
            assert_close(found, dense, TOLERANCE["float64"], "dense GCN logits")


def test_zero_hops_equals_fedavg_with_an_unweighted_mean(toy_graph, tmp_path):
    """No round: FedGraph's FedAvg path, i.e. this project's fedavg with FedGCN's settings (SGD
    lr 0.5, weight decay 5e-4, 3 local steps, hidden 16, the unweighted mean) gives the same
    parameters bit for bit after a few rounds (at dropout 0: fedavg's GNN also drops the input
    features). Clients of unequal training sizes, so the weighting shows."""
    parts = np.repeat([0, 1, 2], [10, 20, 30])[np.random.default_rng(2).permutation(60)]
    shard_dir = write_shards(toy_graph, parts, tmp_path / "unequal")
    fedgcn = fedgcn_config(shard_dir, hops=0, dropout=0.0, dtype="float64")
    settings = dict(optimizer="sgd", lr=0.5, weight_decay=5e-4, local_epochs=3, hidden=16,
                    dropout=0.0, dtype="float64")
    fedavg = TrainConfig(shards=str(shard_dir), algo="fedavg", client_weights="uniform",
                         **settings)
    weighted = TrainConfig(shards=str(shard_dir), algo="fedavg", **settings)
    found, expected, by_train_nodes = (
        flatten(train_and_predict(shard_dir, c, rounds=4)[0][2].parameters())
        for c in (fedgcn, fedavg, weighted))
    assert torch.equal(found, expected)
    # (and so something trained)
    assert not torch.allclose(found, by_train_nodes, atol=1e-6), "the weights changed nothing"


def test_client_weights_train_nodes_or_one_and_none_without_training_nodes():
    assert client_weight(12, "train") == 12.0 and client_weight(12, "uniform") == 1.0
    assert client_weight(0, "train") == 0.0 and client_weight(0, "uniform") == 0.0
    with pytest.raises(ValueError, match="--client-weights 'mean', expected one of train, uniform"):
        client_weight(3, "mean")


def test_fedgcns_defaults_are_the_references_and_an_explicit_flag_wins():
    config = parse_args(["--algo", "fedgcn"], quiet=True)
    resolved = config.replace(**get_method("fedgcn").default_changes({"algo"}, config.layers))
    assert (resolved.optimizer, resolved.lr, resolved.weight_decay, resolved.local_epochs,
            resolved.hidden, resolved.dropout, resolved.client_weights, resolved.hops,
            resolved.layers) == ("sgd", 0.5, 5e-4, 3, 16, 0.5, "uniform", 2, 2)
    given = parse_args(["--algo", "fedgcn", "--lr", "0.1", "--hops", "1"], quiet=True)
    explicit = given.replace(**get_method("fedgcn").default_changes({"algo", "lr", "hops"},
                                                                    given.layers))
    assert (explicit.lr, explicit.hops, explicit.optimizer) == (0.1, 1, "sgd")
    assert parse_args([], quiet=True).optimizer == "adam"  # every other method's stays


@pytest.mark.parametrize("argv,message", [
    (["--algo", "fedgcn", "--hops", "3"], "--hops is 3, expected one of 0, 1, 2"),
    (["--algo", "fedgcn", "--hops", "-1"], "--hops is -1, expected one of 0, 1, 2"),
    (["--algo", "fedavg", "--hops", "1"], "--hops with --algo 'fedavg': expected --algo one "
                                          "of fedgcn"),
    (["--hops", "2"], "--hops with --algo 'ours'"),
    (["--algo", "fedgcn", "--layers", "1"], "--layers 1 with --algo fedgcn --hops 2: expected "
                                            "--layers >= 2"),
    (["--algo", "fedgcn", "--exchange", "reduce"], "--exchange reduce with --algo fedgcn: "
                                                   "expected --exchange compact"),
    (["--algo", "ours", "--client-weights", "uniform"], "--client-weights uniform with --algo "
                                                        "'ours': expected --algo one of fedavg, "
                                                        "fedavg-nc, fedsage-plus, fedgcn"),
    (["--algo", "fedgcn", "--optimizer", "rmsprop"], "argument --optimizer: invalid choice"),
    (["--algo", "fedgcn", "--hops", "two"], "argument --hops: invalid int value"),
    (["--algo", "fedgcn", "--round-norm", "mean"], "argument --round-norm: invalid choice"),
    (["--algo", "fedavg", "--round-norm", "sym"], "--round-norm sym with --algo 'fedavg': "
                                                  "expected --algo one of fedgcn"),
    (["--algo", "fedgcn", "--hops", "0", "--round-norm", "row"], "--round-norm row with --hops "
                                                                 "0: expected --hops 1 or 2"),
])
def test_each_bad_flag_is_a_clear_error_at_start(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv, quiet=False)
    assert stopped.value.code == USAGE_ERROR
    assert message in capsys.readouterr().err


def test_zero_hops_and_one_layer_is_fedavgs_one_layer_model():
    parse_args(["--algo", "fedgcn", "--hops", "0", "--layers", "1"], quiet=True)
    parse_args(["--algo", "fedgcn", "--hops", "0", "--exchange", "reduce"], quiet=True)
