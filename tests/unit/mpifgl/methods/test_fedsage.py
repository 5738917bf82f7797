"""mpifgl.methods.fedsage: the other clients' greedy terms routed through the server give the
gradient computed with their features at hand (ranks as threads, tests/helpers/thread_comm.py),
and no raw feature reaches the server; the mending of the full local graph; NeighGen's flags
refused by name (the mpirun runs are in tests/mpi/test_fedsage.py)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig, parse_config
from mpifgl.graph import ClientGraph
from mpifgl.methods import get_method
from mpifgl.methods.fedavg import local_graph
from mpifgl.methods.fedsage import NeighGenClient, exchange_generated_rows
from mpifgl.methods.neighgen import answer_rows, draw_targets, greedy_slot_losses, slot_rows
from mpifgl.trainer import RankSetup
from tests.helpers.thread_comm import ThreadWorld

NUM_PRED, WIDTH = 3, 4


def client_data(client: int):
    """Client ``client``'s own graph and features, and the rows it generated for G nodes."""
    rng = np.random.default_rng(client)
    n = 6 + client
    upper = sp.triu(sp.random(n, n, density=0.5, random_state=client), k=1)
    adjacency = ((upper + upper.T) > 0).astype(np.float32).tocsr()
    x = torch.from_numpy(rng.normal(size=(n, WIDTH)))
    groups = np.stack([rng.integers(1, NUM_PRED + 1, 4 + client),
                       rng.integers(1, NUM_PRED + 1, 4 + client)], axis=1).astype(np.int64)
    generated = torch.from_numpy(rng.normal(size=(groups.shape[0], NUM_PRED, WIDTH)))
    return adjacency, x, groups, generated


def answer_seed(client: int) -> int:
    return 1000 + client


def test_routed_greedy_terms_equal_the_gradient_with_the_features_at_hand():
    num_clients = 3
    data = [client_data(c) for c in range(num_clients)]
    world = ThreadWorld(num_clients + 1)

    def body(comm):
        if comm.is_server:
            return exchange_generated_rows(comm, torch.zeros((0, WIDTH), dtype=torch.float64),
                                           np.zeros((0, 2), np.int64), None)
        adjacency, x, groups, generated = data[comm.client_id]
        node, slot = slot_rows(groups[:, 0])
        draws = np.random.default_rng(answer_seed(comm.client_id))
        return exchange_generated_rows(
            comm, generated[node, slot], groups,
            lambda rows, theirs: answer_rows(rows, theirs, adjacency, x, NUM_PRED, draws))

    results = world.run(body)
    # the same terms, every client's features at hand: client j answers client (j - s) mod M in
    # round s, drawing its targets from its own stream in that order
    draws = [np.random.default_rng(answer_seed(c)) for c in range(num_clients)]
    expected_gradient = [torch.zeros_like(d[3]) for d in data]
    expected_loss = [0.0] * num_clients
    for shift in range(1, num_clients):
        for j in range(num_clients):
            i = (j - shift) % num_clients
            adjacency, x = data[j][0], data[j][1]
            groups, generated = data[i][2], data[i][3].clone().requires_grad_(True)
            targets = draw_targets(adjacency, x, groups.shape[0], NUM_PRED, draws[j])
            losses = greedy_slot_losses(generated, targets, torch.from_numpy(groups[:, 0]),
                                        torch.from_numpy(groups[:, 1]))
            losses.sum().backward()
            expected_gradient[i] += generated.grad
            expected_loss[i] += losses.sum().item()
    for i in range(num_clients):
        node, slot = slot_rows(data[i][2][:, 0])
        answers = results[i + 1]
        assert answers.shape == (node.shape[0], WIDTH + 1)
        assert torch.allclose(answers[:, :-1], expected_gradient[i][node, slot], atol=1e-12)
        assert float(answers[:, -1].sum()) == pytest.approx(expected_loss[i], rel=1e-12)
        assert (answers[:, :-1] != 0).any()
    assert results[0].shape == (0, WIDTH + 1)
    # what the server received: generated rows, counts and gradients, never a feature value
    received = np.concatenate([a.ravel() for kind, rank, a in world.server_received
                               if a.dtype == np.float64])
    features = np.concatenate([d[1].numpy().ravel() for d in data])
    assert received.size and not np.isin(features, received).any()


def toy_setup(toy_shards, **flags) -> RankSetup:
    """Client 1 of the toy graph over 2 clients, as the one client of a one-process world."""
    shard_dir = toy_shards(2)
    sizes = read_manifest(shard_dir).client_sizes()
    graph = ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(1)), sizes)
    alone = ClientGraph(0, np.asarray([graph.num_nodes]), np.arange(graph.num_nodes), graph.x,
                        graph.y, graph.train_mask, graph.val_mask, graph.test_mask,
                        graph.degree, graph.inner,
                        sp.csr_matrix((graph.num_nodes, graph.num_nodes), dtype=np.float32))
    config = TrainConfig(algo="fedsage-plus", dtype="float64", neighgen_epochs=2,
                         neighgen_generator_widths=(8, 16), **flags)
    return RankSetup.create(config, LocalComm(), alone, 3)


def test_mending_attaches_generated_nodes_to_kept_nodes_in_the_full_graph(toy_shards):
    setup = toy_setup(toy_shards)
    client = NeighGenClient(setup)
    client.train_locally()
    with torch.no_grad():  # a dGen that predicts 2.7 hidden neighbours everywhere
        client.model.count.weight.zero_()
        client.model.count.bias.fill_(2.7)
    edges, features = client.mend()
    graph, kept = setup.graph, client.impaired.kept
    assert client.impaired.num_hidden > 0
    per_node = np.asarray(edges.sum(axis=1)).ravel()
    assert np.array_equal(np.flatnonzero(per_node), kept)  # the hidden nodes get none
    assert (per_node[kept] == 2).all() and edges.shape == (graph.num_nodes, 2 * kept.shape[0])
    assert np.array_equal(np.asarray(edges.sum(axis=0)).ravel(), np.ones(edges.shape[1]))
    assert features.shape == (edges.shape[1], graph.x.shape[1]) and np.abs(features).max() <= 1
    mended = local_graph(graph, edges, features)
    assert (mended.graph.inner[:graph.num_nodes, :graph.num_nodes] != graph.inner).nnz == 0
    assert np.array_equal(mended.graph.degree[:graph.num_nodes],
                          np.diff(graph.inner.indptr) + per_node)
    assert not mended.graph.train_mask[graph.num_nodes:].any()
    # the same seeds, the same mended graph (a resumed run builds it again)
    again = NeighGenClient(toy_setup(toy_shards))
    again.train_locally()
    with torch.no_grad():
        again.model.count.weight.zero_()
        again.model.count.bias.fill_(2.7)
    edges_again, features_again = again.mend()
    assert (edges_again != edges).nnz == 0 and np.array_equal(features_again, features)


def test_chunked_generator_recomputes_the_same_dropout_in_the_backward_pass(toy_shards):
    """Above --neighgen-chunk-rows, fGen's chunks are recomputed in the backward pass: the rows
    and gradients equal those of the same chunks kept in memory (each chunk's seed redraws its
    dropout mask)."""
    client = NeighGenClient(toy_setup(toy_shards))
    generator = client.model.features
    generator.train()
    z = torch.randn(client.x.shape[0], 128, dtype=torch.float64, requires_grad=True)
    state = client.rng.get_state()
    checkpointed = generator(z, client.rng, 7)
    checkpointed.square().sum().backward()
    recomputed = [p.grad.clone() for p in generator.parameters()] + [z.grad.clone()]
    generator.zero_grad()
    z.grad = None
    client.rng.set_state(state)  # the same draws, every chunk kept
    noise = torch.randn(z.shape, generator=client.rng, dtype=z.dtype)
    pieces = []
    for start in range(0, z.shape[0], 7):
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=client.rng))
        pieces.append(generator._rows((z + noise)[start:start + 7], seed))
    kept = torch.cat(pieces).view_as(checkpointed)
    kept.square().sum().backward()
    assert z.shape[0] > 7 and torch.equal(checkpointed.detach(), kept.detach())
    for a, p in zip(recomputed, list(generator.parameters()) + [z]):
        assert torch.allclose(a, p.grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("flag,value,message", [
    ("neighgen_hidden_portion", 1.5, "--neighgen-hidden-portion is 1.5, expected a fraction"),
    ("neighgen_num_pred", 0, "--neighgen-num-pred is 0, expected an integer >= 1"),
    ("neighgen_hidden", 0, "--neighgen-hidden is 0, expected an integer >= 1"),
    ("neighgen_latent", -1, "--neighgen-latent is -1, expected an integer >= 1"),
    ("neighgen_generator_widths", (256, 0), "--neighgen-generator-widths is '256,0'"),
    ("neighgen_generator_widths", (), "--neighgen-generator-widths is ''"),
    ("neighgen_dropout", 1.0, "--neighgen-dropout is 1.0, expected a probability"),
    ("neighgen_lr", 0.0, "--neighgen-lr is 0.0, expected a positive number"),
    ("neighgen_weight_decay", -1.0, "--neighgen-weight-decay is -1.0, expected a number >= 0"),
    ("neighgen_count_weight", -1.0, "--neighgen-count-weight is -1.0"),
    ("neighgen_feature_weight", -0.5, "--neighgen-feature-weight is -0.5"),
    ("neighgen_class_weight", -2.0, "--neighgen-class-weight is -2.0"),
    ("neighgen_epochs", -1, "--neighgen-epochs is -1, expected an integer >= 0"),
    ("neighgen_fed_epochs", -3, "--neighgen-fed-epochs is -3"),
    ("neighgen_chunk_rows", -1, "--neighgen-chunk-rows is -1"),
    ("neighgen_hide_from", "test", "--neighgen-hide-from is 'test', expected one of "
                                   "not-train-test, val"),
    ("client_weights", "size", "--client-weights is 'size', expected one of train, uniform"),
    ("neighgen_count_rounding", "ceil", "--neighgen-count-rounding is 'ceil', expected one of "
                                        "floor, round"),
])
def test_neighgen_flags_are_refused_by_name(flag, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        TrainConfig(algo="fedsage-plus", **{flag: value}).validate()


def test_fedsage_plus_defaults_are_the_references():
    config = parse_config(["--algo", "fedsage-plus"])
    assert (config.neighgen_num_pred, config.neighgen_hidden, config.neighgen_latent,
            config.neighgen_generator_widths, config.neighgen_dropout) == (5, 32, 128,
                                                                           (256, 2048), 0.5)
    assert (config.neighgen_lr, config.neighgen_weight_decay, config.neighgen_epochs,
            config.neighgen_fed_epochs, config.neighgen_hidden_portion) == (1e-3, 1e-4, 20, 20,
                                                                            0.5)
    method = get_method("fedsage-plus")
    assert config.replace(
        **method.default_changes(set(), config.layers)).client_weights == "uniform"
    assert config.replace(client_weights="train").replace(
        **method.default_changes({"client_weights"}, config.layers)).client_weights == "train"
    assert TrainConfig.from_dict({"neighgen_generator_widths": [4, 8]}) \
        .neighgen_generator_widths == (4, 8)
