"""mpifgl.model: shapes, GCN and 1-GNN against dense references, the in-place evaluation
forward against the autograd one, dropout's stream, and the flat gradient buffer."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mpifgl.graph import ClientGraph, build_operator
from mpifgl.model import (GNN, dropout, dropout_scale, flatten, gradients, relu_dropout,
                          unflatten)
from tests.helpers.graphs import random_graph, random_parts, write_shards
from fgl_common.shard_format import load_client_shard, shard_filename


@pytest.fixture
def merged(tmp_path) -> ClientGraph:
    graph = random_graph(n=30, avg_degree=4, d=5, classes=3, seed=2, isolated=2)
    shard_dir = write_shards(graph, random_parts(30, 2, seed=1), tmp_path / "shards")
    return ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                               for i in range(2)])


def full_operator(graph: ClientGraph, backbone: str):
    return build_operator(graph, backbone, None, None, torch.float64, exchanged=False)


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_forward_gives_one_row_of_logits_per_node(merged, backbone, layers):
    model = GNN(backbone, 5, 8, 3, layers, 0.0, seed=0, dtype=torch.float64)
    assert model.widths == [5] + [8] * (layers - 1) + [3]
    out = model(torch.from_numpy(merged.x).double(), full_operator(merged, backbone))
    assert out.shape == (30, 3) and out.dtype == torch.float64


def test_gcn_equals_the_dense_formula(merged):
    """Two layers: A^ relu(A^ X W1^T + b1) W2^T + b2, A^ = D~^-1/2 (A + I) D~^-1/2."""
    model = GNN("gcn", 5, 8, 3, 2, 0.0, seed=4, dtype=torch.float64)
    adj = merged.inner.toarray().astype(np.float64)
    d = 1.0 / np.sqrt(adj.sum(axis=1) + 1.0)
    a_hat = torch.from_numpy(d[:, None] * (adj + np.eye(30)) * d[None, :])
    x = torch.from_numpy(merged.x).double()
    first, second = model.layers
    hidden = torch.relu(a_hat @ x @ first.lin.weight.T + first.bias)
    expected = a_hat @ hidden @ second.lin.weight.T + second.bias
    got = model(x, full_operator(merged, "gcn"))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_one_gnn_equals_the_dense_formula(merged):
    """One layer: X W_root^T + A X W_rel^T + b (PyG GraphConv with sum aggregation)."""
    model = GNN("1gnn", 5, 8, 3, 1, 0.0, seed=4, dtype=torch.float64)
    adj = torch.from_numpy(merged.inner.toarray().astype(np.float64))
    x = torch.from_numpy(merged.x).double()
    layer = model.layers[0]
    expected = x @ layer.lin_root.weight.T + adj @ x @ layer.lin_rel.weight.T + layer.lin_rel.bias
    torch.testing.assert_close(model(x, full_operator(merged, "1gnn")), expected,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_evaluation_forward_equals_the_autograd_forward(merged, backbone, dtype):
    """Evaluation runs in place under no_grad with the same operations in the same order: the
    logits are equal bit for bit, not just close."""
    model = GNN(backbone, 5, 8, 3, 3, 0.0, seed=1, dtype=dtype)
    op = build_operator(merged, backbone, None, None, dtype, exchanged=False)
    x = torch.from_numpy(merged.x).to(dtype)
    with_graph = model(x, op)
    assert with_graph.requires_grad
    with torch.no_grad():
        in_place = model(x, op)
    assert torch.equal(in_place, with_graph.detach())


@pytest.mark.parametrize("aggregated", [False, True], ids=["input", "input-aggregate"])
def test_a_forward_that_owns_its_input_masks_it_in_place_with_the_same_numbers(merged,
                                                                               aggregated):
    """``own_input`` (a sampled step's copied rows): the first layer's dropout overwrites the
    input and its aggregate instead of masking copies, and the logits and every gradient are
    the same bit for bit; the stream moves alike."""
    x = torch.from_numpy(merged.x).double()
    results = []
    for own_input in (False, True):
        model = GNN("gcn", 5, 8, 3, 2, 0.4, seed=3, dtype=torch.float64)
        op = full_operator(merged, "gcn")
        if aggregated:
            op.input_aggregate = x.flip(0).clone()
        given, rng = x.clone(), np.random.default_rng(6)
        logits = model(given, op, rng, own_input=own_input)
        logits.square().sum().backward()
        assert own_input == (not torch.equal(given, x))
        results.append((logits.detach(), [p.grad for p in model.parameters()],
                        rng.bit_generator.state))
    (first, first_grads, first_state), (second, second_grads, second_state) = results
    assert torch.equal(first, second) and first_state == second_state
    assert all(torch.equal(a, b) for a, b in zip(first_grads, second_grads))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5])
def test_the_fused_relu_and_dropout_gives_relu_then_dropouts_numbers(p, dtype):
    """The same output and input gradient, bit for bit, from the same draws (the fused form
    keeps only its output for backward), and the stream left in the same state."""
    h = torch.randn(50, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    grad = torch.randn(50, 6, generator=torch.Generator().manual_seed(2)).to(dtype)
    found_in, expected_in = h.clone().requires_grad_(), h.clone().requires_grad_()
    found_rng, expected_rng = np.random.default_rng(3), np.random.default_rng(3)
    found = relu_dropout(found_in * 1.0, p, found_rng)
    mask = dropout_scale(h, p, expected_rng)
    relu = torch.relu(expected_in)
    expected = relu * mask if mask is not None else relu
    found_values = found.detach().clone()  # backward writes the gradient over the result
    found.backward(grad)
    expected.backward(grad)
    assert torch.equal(found_values, expected.detach())
    assert torch.equal(found_in.grad, expected_in.grad)
    assert found_rng.bit_generator.state == expected_rng.bit_generator.state
    assert (mask is None) == (p == 0.0) and bool((found_values == 0).any())


def _saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` builds its graph."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


@pytest.mark.parametrize("backbone", ["gcn", "1gnn", "sage"])
def test_a_training_forward_with_dropout_is_relu_then_dropout_and_keeps_less(merged, backbone):
    """The model's training forward equals its layers called one by one with relu, then
    dropout of each layer's input from the same stream: logits and every gradient bit for bit.
    It keeps one [n, hidden] tensor of each hidden layer for backward where the two operations
    keep three."""
    x = torch.from_numpy(merged.x).double()
    op = full_operator(merged, backbone)
    model = GNN(backbone, 5, 8, 3, 3, 0.4, seed=3, dtype=torch.float64)
    rng = np.random.default_rng(6)
    logits = model(x, op, rng)
    logits.square().sum().backward()
    found = [logits.detach()] + [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    expected_rng = np.random.default_rng(6)

    def unfused():
        z = x
        for k, layer in enumerate(model.layers):
            z = layer(dropout(z, 0.4, expected_rng), op)
            z = torch.relu(z) if k < len(model.layers) - 1 else z
        return z
    expected = unfused()
    expected.square().sum().backward()
    assert torch.equal(found[0], expected.detach())
    assert all(torch.equal(a, p.grad) for a, p in zip(found[1:], model.parameters()))
    assert rng.bit_generator.state == expected_rng.bit_generator.state

    expected_rng = np.random.default_rng(6)
    hidden_bytes = 30 * 8 * 8  # one [n, hidden] float64 tensor
    fused_bytes = _saved_bytes(lambda: model(x, op, np.random.default_rng(6)))
    unfused_bytes = _saved_bytes(unfused)
    assert unfused_bytes - fused_bytes >= 2 * 2 * hidden_bytes  # two hidden layers, two each


def test_gcn_on_an_aggregated_input_is_one_product_of_the_sum_and_keeps_one_input(merged):
    """GCN's first layer on a done propagation (--exact-first-layer): (aggregate + self_scale
    * z) W^T + b equals the propagation's and the self term's products summed, output and
    gradients (float64); autograd keeps one [n, in] tensor where the two products kept both.
    SparseFeatures take the two products."""
    from mpifgl.model import GCNLayer, GraphLayer
    from mpifgl.operators import SparseFeatures
    op = full_operator(merged, "gcn")
    rng = np.random.default_rng(8)
    z = torch.from_numpy(rng.standard_normal((30, 5)))
    aggregate = torch.from_numpy(rng.standard_normal((30, 5)))
    layer = GCNLayer(5, 4).double()
    layer.reset(torch.Generator().manual_seed(1))
    found = layer.forward_aggregated(z, aggregate, op)
    found.square().sum().backward()
    found_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    expected = GraphLayer.forward_aggregated(layer, z, aggregate, op)
    expected.square().sum().backward()
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    for a, p in zip(found_grads, layer.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-12, atol=1e-12)
    one_input = 30 * 5 * 8
    assert (_saved_bytes(lambda: GraphLayer.forward_aggregated(layer, z, aggregate, op))
            - _saved_bytes(lambda: layer.forward_aggregated(z, aggregate, op))) >= one_input
    sparse = layer.forward_aggregated(SparseFeatures.of_dense(z), aggregate, op)
    torch.testing.assert_close(sparse, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse-features"])
def test_gcn_folds_its_self_term_into_the_aggregate_and_drops_that_sum_with_one_mask(merged,
                                                                                      sparse):
    """The folded first layer (``input_has_self``, no x): without dropout the logits and
    gradients of the unfolded layer (1e-12); in training, the layer of one mask over the sum
    (aggregate + self_scale * x), drawn as the next draws of the stream, and the hidden layers'
    draws after it. 1-GNN, whose root has a weight of its own, does not fold."""
    import dataclasses
    from mpifgl.model import GCNLayer, OneGNNLayer
    from mpifgl.operators import SparseFeatures
    x = torch.from_numpy(merged.x).double()
    aggregate = torch.from_numpy(np.random.default_rng(4).standard_normal((30, 5)))
    op = dataclasses.replace(full_operator(merged, "gcn"), input_aggregate=aggregate)
    folded = dataclasses.replace(op, input_aggregate=aggregate.clone(), input_has_self=True)
    features = SparseFeatures.of_dense(x) if sparse else x
    model = GNN("gcn", 5, 8, 3, 2, 0.4, seed=3, dtype=torch.float64)
    assert model.layers[0].fold_self_term(folded.input_aggregate, features, op)
    runs = []
    for given, operator in ((x, op), (None, folded)):
        model.zero_grad()
        logits = model(given, operator)
        logits.square().sum().backward()
        runs.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(runs[1][1], runs[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    found = model(None, folded, np.random.default_rng(6))
    rng = np.random.default_rng(6)
    combined = dropout(folded.input_aggregate, 0.4, rng)
    hidden = relu_dropout(model.layers[0].forward_folded(combined), 0.4, rng)
    torch.testing.assert_close(found, model.layers[1](hidden, op), rtol=1e-12, atol=1e-12)
    assert not OneGNNLayer(5, 4).double().fold_self_term(aggregate.clone(), x, op)
    assert isinstance(model.layers[0], GCNLayer)


def test_same_seed_same_weights_and_an_unknown_backbone_is_named():
    first, second = (GNN("gcn", 4, 6, 2, 2, 0.5, seed=9) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    with pytest.raises(ValueError, match="--backbone 'gat', expected one of gcn, 1gnn"):
        GNN("gat", 4, 6, 2, 2, 0.5, seed=9)


def test_flat_gradients_round_trip_with_zeros_for_missing_ones():
    model = GNN("1gnn", 4, 6, 2, 2, 0.0, seed=0, dtype=torch.float64)
    parameters = list(model.parameters())
    sizes = [p.numel() for p in parameters]
    assert flatten(gradients(model)).tolist() == [0.0] * sum(sizes)  # no backward yet
    flat = torch.arange(sum(sizes), dtype=torch.float64)
    for p, grad in zip(parameters, unflatten(flat, parameters)):
        p.grad = grad
    assert torch.equal(flatten(gradients(model)), flat)
    assert model.layers[0].lin_rel.weight.grad.shape == model.layers[0].lin_rel.weight.shape
    with pytest.raises(ValueError, match="a flat vector of 3 values for tensors of"):
        unflatten(flat[:3], parameters)
    assert flatten(parameters, torch.float32).dtype == torch.float32


@pytest.mark.parametrize("shape", [(600, 700), (3, 5), (1001, 1047)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_dropout_mask_on_several_threads_is_one_threads_mask(monkeypatch, shape, dtype):
    """Cut into consecutive pieces of one PCG64 stream, the threads draw the same mask as one
    thread, and leave the stream where one thread leaves it (the next draws agree too); an odd
    count, too few draws or a half-used 64-bit step fall back to one thread."""
    from mpifgl import model
    monkeypatch.setattr(model, "PARALLEL_DRAWS", 1000)
    pools = []

    class CountedPool(model.ThreadPoolExecutor):
        def __init__(self, workers):
            pools.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(model, "ThreadPoolExecutor", CountedPool)
    for first_draws in (0, 1):  # 1: the stream holds half of a 64-bit step
        serial, parallel = np.random.default_rng(11), np.random.default_rng(11)
        serial.random(first_draws, dtype=np.float32)
        parallel.random(first_draws, dtype=np.float32)
        one = model.dropout_mask(serial, shape, 0.3, dtype, threads=1)
        many = model.dropout_mask(parallel, shape, 0.3, dtype, threads=3)
        assert many.dtype == dtype and many.shape == shape
        assert np.array_equal(one, many)
        assert set(np.unique(one)) == {0.0, dtype(1.0 / 0.7)}
        assert serial.bit_generator.state == parallel.bit_generator.state
        assert np.array_equal(serial.random(7), parallel.random(7))
    even = math.prod(shape) % 2 == 0 and math.prod(shape) >= 2000
    assert pools == ([3] if even else [])  # the threads ran where they may (first_draws 0)


@pytest.mark.parametrize("block", [777, 1 << 15])
def test_the_dropout_mask_drawn_in_blocks_is_one_draw_of_the_stream(monkeypatch, block):
    """Drawn in blocks (an odd size splits 64-bit steps between blocks), the mask is the one
    call's draws >= p, and the stream ends where one call leaves it."""
    from mpifgl import model
    monkeypatch.setattr(model, "DRAW_BLOCK", block)
    for first_draws in (0, 1):
        blocked, whole = np.random.default_rng(4), np.random.default_rng(4)
        blocked.random(first_draws, dtype=np.float32)
        whole.random(first_draws, dtype=np.float32)
        mask = model.dropout_mask(blocked, (301, 257), 0.4, np.float32, threads=1)
        expected = (whole.random(301 * 257, dtype=np.float32) >= 0.4) * np.float32(1 / 0.6)
        assert np.array_equal(mask.reshape(-1), expected)
        assert blocked.bit_generator.state == whole.bit_generator.state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_keeps_one_minus_p_scaled_and_is_reproducible(dtype):
    from mpifgl.model import dropout
    p = 0.3
    z = torch.rand(200, 300, dtype=dtype) + 0.5
    z.requires_grad_(True)
    out = dropout(z, p, np.random.default_rng(7))
    again = dropout(z.detach(), p, np.random.default_rng(7))
    assert torch.equal(out.detach(), again)
    # the mask is the numpy stream's uniform draws >= p (documented stream, checkpointed state)
    keep = torch.from_numpy(np.random.default_rng(7).random((200, 300), dtype=np.float32) >= p)
    assert torch.equal(out.detach() != 0, keep)
    torch.testing.assert_close(out.detach()[keep], z.detach()[keep] / (1 - p),
                               rtol=4 * torch.finfo(dtype).eps, atol=0)
    assert abs(keep.double().mean().item() - (1 - p)) < 0.01  # 60,000 draws: 5 sigma is 0.009
    out.sum().backward()
    torch.testing.assert_close(z.grad, keep.to(dtype) / (1 - p), rtol=4 * torch.finfo(dtype).eps,
                               atol=0)
    assert dropout(z, 0.0, np.random.default_rng(7)) is z


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_of_an_input_without_gradient_is_masked_in_place_with_the_same_numbers(
        monkeypatch, dtype):
    """The features (no gradient) are multiplied into the mask's buffer on the rank's threads:
    bit for bit x * mask, as for a tensor that takes a gradient, and the stream moves alike."""
    from mpifgl import model
    monkeypatch.setattr(model, "PARALLEL_DRAWS", 1000)
    x = np.random.default_rng(0).standard_normal((600, 700)).astype(dtype)
    for threads in (1, 3):
        plain, fused = np.random.default_rng(5), np.random.default_rng(5)
        expected = x * model.dropout_mask(plain, x.shape, 0.2, dtype, threads)
        got = model.dropout_mask(fused, x.shape, 0.2, dtype, threads, times=x)
        assert got.dtype == dtype and np.array_equal(got, expected)
        assert plain.bit_generator.state == fused.bit_generator.state
    features = torch.from_numpy(x)
    weights = features.clone().requires_grad_(True)  # takes the multiply of autograd
    dropped = model.dropout(features, 0.2, np.random.default_rng(9))
    assert not dropped.requires_grad
    assert np.array_equal(dropped.numpy(),
                          model.dropout(weights, 0.2, np.random.default_rng(9)).detach().numpy())
    assert np.array_equal(features.numpy(), x)  # the input itself is left as it was
    # a copy made for this one use (a sampled step's rows) is masked over itself: same numbers
    for threads in (1, 3):
        own, plain, fused = x.copy(), np.random.default_rng(5), np.random.default_rng(5)
        expected = x * model.dropout_mask(plain, x.shape, 0.2, dtype, threads)
        got = model.dropout_mask(fused, x.shape, 0.2, dtype, threads, times=own, into_times=True)
        assert np.shares_memory(got, own) and np.array_equal(own, expected)
        assert plain.bit_generator.state == fused.bit_generator.state
    with pytest.raises(ValueError, match="needs times, a C-contiguous array"):
        model.dropout_mask(np.random.default_rng(5), (700, 600), 0.2, dtype, 1,
                           times=x.T, into_times=True)
    own = features.clone()
    in_place = model.dropout(own, 0.2, np.random.default_rng(9), in_place=True)
    assert in_place is own and np.array_equal(own.numpy(), dropped.numpy())
