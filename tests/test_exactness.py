"""The test that matters most: the distributed model equals centralized training.

With no dropout, for 1-4 clients, logits, loss and every weight gradient of the MPI run equal
(1e-10 in float64, 1e-5 in float32) the program's own centralized mode, on the full graph and on
one fixed sample, and PyG's GCNConv / GraphConv given the same weights (full graph), for every
exchange mode, with the default buffers and with one-row chunks.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from graphs import Graph, random_graph, random_parts, write_shards
from mpi_util import REPO, run_mpi
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.model import flat_grads, select_rows
from mpifgl.sampling import NodeSample
from mpifgl.communicator import LocalComm
from mpifgl.methods import build_trainer

PROBE = str(REPO / "tests" / "mpi_scripts" / "probe_exactness.py")
sys.path.insert(0, str(REPO / "tests" / "mpi_scripts"))
from probe_exactness import fixed_sample  # noqa: E402  (the probe's sample, same code)
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
CASES = [(b, d) for b in ("gcn", "1gnn") for d in ("float64", "float32")]


def centralized_reference(shard_dir, backbone: str, dtype: str, layers: int, sampled=False):
    """The program's own centralized mode on the merged shards, outputs in global order; with
    ``sampled``, one step on the probe's fixed sample (logits of the sampled rows only)."""
    manifest = read_manifest(shard_dir)
    shards = [load_client_shard(shard_dir / shard_filename(i)) for i in range(manifest.num_clients)]
    graph = ClientGraph.merged(shards)
    config = TrainConfig(backbone=backbone, dtype=dtype, dropout=0.0, sampling="none",
                         layers=layers, hidden=16, seed=3)
    gnn = build_trainer(config, LocalComm(), graph, manifest.num_classes).method
    if not sampled:
        loss = gnn.loss_and_gradients(gnn.full_operator,
                                      gnn.setup.global_split_counts["train"])
        logits = np.empty_like(gnn.full_logits().numpy())
        logits[graph.global_id] = gnn.full_logits().numpy()
        return loss, flat_grads(gnn.model), logits, gnn.model.state_dict()
    samples = fixed_sample(manifest.client_sizes())
    offsets = np.concatenate([[0], np.cumsum(manifest.client_sizes())])
    merged = NodeSample(np.concatenate([offsets[j] + s.index for j, s in enumerate(samples)]),
                        np.concatenate([s.probability for s in samples]))
    operator, train_rows = gnn.operator_for_sample(merged)
    loss = gnn.loss_and_gradients(operator, train_rows)
    gnn.model.eval()
    logits = gnn.model(select_rows(gnn.x, operator.rows), operator, None).detach().numpy()
    order = np.argsort(graph.global_id[operator.rows])
    return loss, flat_grads(gnn.model), logits[order], graph.global_id[operator.rows][order]


def pyg_reference(graph: Graph, state_dict, backbone: str, dtype: str, layers: int):
    """Independent implementation: PyG convs on the original graph with the same weights."""
    from torch_geometric.nn import GCNConv, GraphConv
    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    widths = [graph.x.shape[1]] + [16] * (layers - 1) + [graph.num_classes]
    conv = (lambda a, b: GCNConv(a, b)) if backbone == "gcn" else (lambda a, b: GraphConv(a, b))
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(conv(widths[k], widths[k + 1]) for k in range(layers))
    model.load_state_dict(state_dict)
    model.to(torch_dtype)
    coo = sp.coo_matrix(graph.adj)
    edge_index = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
    z = torch.from_numpy(graph.x).to(torch_dtype)
    for k, layer in enumerate(model.layers):
        z = layer(z, edge_index)
        if k < layers - 1:
            z = torch.relu(z)
    train = torch.from_numpy(graph.train_mask)
    loss = torch.nn.functional.cross_entropy(z[train], torch.from_numpy(graph.y)[train])
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy()
    return float(loss.detach()), grads, z.detach().numpy()


def assert_close(found, expected, tolerance, what):
    """Max abs error within tolerance, scaled by the magnitude when it exceeds 1 (1-GNN sums
    over neighbours, so its values and gradients grow with the degree)."""
    found, expected = np.asarray(found, np.float64), np.asarray(expected, np.float64)
    assert found.shape == expected.shape, f"{what}: shape {found.shape} != {expected.shape}"
    error = np.max(np.abs(found - expected)) if found.size else 0.0
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    assert error <= tolerance * scale, \
        f"{what}: max abs error {error:.3e} > {tolerance:.0e} x scale {scale:.3g}"


def check_against_references(graph: Graph, shard_dir, layers: int, probe_file):
    results = np.load(probe_file)
    for backbone, dtype in CASES:
        key, tol = f"{backbone}_{dtype}", TOLERANCE[dtype]
        loss, grads, logits, state = centralized_reference(shard_dir, backbone, dtype, layers)
        for name, reference in (("centralized", (loss, grads, logits)),
                                # PyG in float64 with the same weights: an exact reference for
                                # both dtypes (PyG's own float32 sums round more than ours)
                                ("PyG", pyg_reference(graph, state, backbone, "float64",
                                                      layers))):
            assert_close(results[f"{key}_logits"], reference[2], tol, f"{key} logits vs {name}")
            assert_close(results[f"{key}_loss"], reference[0], tol, f"{key} loss vs {name}")
            assert_close(results[f"{key}_grads"], reference[1], tol, f"{key} grads vs {name}")
        loss, grads, logits, ids = centralized_reference(shard_dir, backbone, dtype, layers,
                                                         sampled=True)
        np.testing.assert_array_equal(results["sampled_ids"], ids)
        assert_close(results[f"sampled_{key}_logits"], logits, tol, f"sampled {key} logits")
        assert_close(results[f"sampled_{key}_loss"], loss, tol, f"sampled {key} loss")
        assert_close(results[f"sampled_{key}_grads"], grads, tol, f"sampled {key} grads")


def run_probe(shard_dir, out, ranks: int, layers: int, mode: str = "compact",
              buffer_mb: float = 256.0):
    done = run_mpi(ranks, [PROBE, str(shard_dir), str(out), str(layers), mode, str(buffer_mb)],
                   timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


@pytest.mark.mpi
@pytest.mark.timeout(260)
@pytest.mark.parametrize("num_clients", [1, 2, 3, 4])
def test_distributed_equals_centralized_small_graph(toy_graph, tmp_path, num_clients):
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=5),
                             tmp_path / "shards")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, num_clients + 1, 3)
    check_against_references(toy_graph, shard_dir, 3, out)


# A cap of a few rows (4 float64 rows of the widest layer, 16) makes every exchange many chunks;
# one-row chunks (any cap below a row) work too but cost minutes under mpirun on 2 cores.
TINY_MB = 4 * 16 * 8 / 2 ** 20


@pytest.mark.mpi
@pytest.mark.timeout(500)
@pytest.mark.parametrize("mode", ["compact", "compact-reduce", "reduce", "star"])
def test_every_exchange_mode_with_tiny_chunks_equals_centralized(toy_graph, tmp_path, mode):
    """Chunked exchanges compute the same model: bit for bit where the server sums (compact,
    star), to float rounding where MPI_Reduce does."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=5),
                             tmp_path / "shards")
    whole = run_probe(shard_dir, tmp_path / "whole.npz", 4, 2, mode)
    chunked = run_probe(shard_dir, tmp_path / "chunked.npz", 4, 2, mode, TINY_MB)
    check_against_references(toy_graph, shard_dir, 2, tmp_path / "chunked.npz")
    for key in whole.files:
        if mode in ("compact", "star"):
            np.testing.assert_array_equal(chunked[key], whole[key], err_msg=key)
        else:
            assert_close(chunked[key], whole[key], 1e-12 if "float64" in key else 1e-6, key)


def two_islands_graph() -> tuple[Graph, np.ndarray]:
    """A graph of two components: the first split over clients 0 and 1, the second (with an
    isolated node) all on client 2, which therefore sends and receives no cross terms."""
    first = random_graph(n=40, avg_degree=5, d=7, classes=3, seed=12, isolated=0)
    second = random_graph(n=20, avg_degree=4, d=7, classes=3, seed=13, isolated=1)
    graph = Graph(sp.block_diag([first.adj, second.adj], format="csr").astype(np.float32),
                  np.vstack([first.x, second.x]), np.concatenate([first.y, second.y]),
                  *(np.concatenate([getattr(first, m), getattr(second, m)])
                    for m in ("train_mask", "val_mask", "test_mask")))
    parts = np.concatenate([random_parts(40, 2, seed=3), np.full(20, 2)])
    return graph, parts


@pytest.mark.mpi
@pytest.mark.timeout(260)
@pytest.mark.parametrize("mode,buffer_mb", [("compact", 256.0), ("compact", TINY_MB),
                                            ("compact-reduce", TINY_MB)])
def test_owner_that_receives_nothing(tmp_path, mode, buffer_mb):
    graph, parts = two_islands_graph()
    shard_dir = write_shards(graph, parts, tmp_path / "shards")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, 4, 2, mode, buffer_mb)
    check_against_references(graph, shard_dir, 2, out)


@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_star_exchange_equals_centralized_and_reduce(toy_graph, tmp_path):
    """--exchange star (Gather at the server, summed there in client order) computes the same
    model as the Reduce exchange and as centralized training."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 3, seed=5),
                             tmp_path / "shards")
    outputs = {}
    for mode in ("star", "reduce"):
        outputs[mode] = tmp_path / f"{mode}.npz"
        run_probe(shard_dir, outputs[mode], 4, 2, mode)
    check_against_references(toy_graph, shard_dir, 2, outputs["star"])
    star, reduce = np.load(outputs["star"]), np.load(outputs["reduce"])
    for key in star.files:
        tolerance = 1e-12 if "float64" in key else 1e-6
        assert_close(star[key], reduce[key], tolerance, f"{key}: star vs reduce")


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_clients", [3])
def test_distributed_equals_centralized_cora(cora_graph, tmp_path, num_clients):
    shard_dir = write_shards(cora_graph, random_parts(cora_graph.num_nodes, num_clients, seed=1),
                             tmp_path / "shards", dataset="cora")
    out = tmp_path / "probe.npz"
    run_probe(shard_dir, out, num_clients + 1, 2)
    check_against_references(cora_graph, shard_dir, 2, out)


def test_centralized_mode_equals_pyg_without_mpi(toy_graph, tmp_path):
    """Plain-pytest tier of the same check (one client, no mpirun)."""
    shard_dir = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 2, seed=2),
                             tmp_path / "shards")
    for backbone, dtype in CASES:
        loss, grads, logits, state = centralized_reference(shard_dir, backbone, dtype, 2)
        reference = pyg_reference(toy_graph, state, backbone, dtype, 2)
        assert_close(logits, reference[2], TOLERANCE[dtype], f"{backbone} {dtype} logits")
        assert_close(loss, reference[0], TOLERANCE[dtype], f"{backbone} {dtype} loss")
        assert_close(grads, reference[1], TOLERANCE[dtype], f"{backbone} {dtype} grads")


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_sparse_and_dense_features_agree(toy_graph, tmp_path, backbone):
    """The sparse first-layer path (bag-of-words inputs) computes the dense path's numbers."""
    graph = Graph(toy_graph.adj, np.where(toy_graph.x > 1.0, toy_graph.x, 0).astype(np.float32),
                  toy_graph.y, toy_graph.train_mask, toy_graph.val_mask, toy_graph.test_mask)
    shard_dir = write_shards(graph, random_parts(graph.num_nodes, 1), tmp_path / "shards")
    manifest = read_manifest(shard_dir)
    merged = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(0))])
    results = {}
    for feature_format in ("dense", "sparse"):
        config = TrainConfig(backbone=backbone, dtype="float64", dropout=0.0, sampling="none",
                             hidden=16, seed=3, feature_format=feature_format)
        gnn = build_trainer(config, LocalComm(), merged, manifest.num_classes).method
        loss = gnn.loss_and_gradients(gnn.full_operator,
                                      gnn.setup.global_split_counts["train"])
        results[feature_format] = (loss, flat_grads(gnn.model), gnn.full_logits().numpy())
    for k, what in enumerate(("loss", "grads", "logits")):
        assert_close(results["sparse"][k], results["dense"][k], 1e-12, what)


def test_csr_row_column_selection_and_transpose_match_scipy():
    """The sampled operators are sliced with bare CSR arrays every step: same entries, same
    order as scipy's csr[rows][:, cols] and .T.tocsr()."""
    from mpifgl.graph import CSRArrays
    rng = np.random.default_rng(0)
    matrix = sp.random(60, 90, density=0.1, format="csr", random_state=1, dtype=np.float32)
    rows = np.sort(rng.choice(60, size=25, replace=False))
    cols = np.sort(rng.choice(90, size=40, replace=False))
    col_map = np.full(90, -1, dtype=np.int64)
    col_map[cols] = np.arange(cols.shape[0])
    selected = CSRArrays.of(matrix).select(rows, col_map, cols.shape[0])
    expected = matrix[rows][:, cols].tocsr()
    expected.sort_indices()
    got = sp.csr_matrix((selected.data, selected.indices, selected.indptr), shape=selected.shape)
    np.testing.assert_array_equal(got.toarray(), expected.toarray())
    np.testing.assert_array_equal(selected.indptr, expected.indptr)
    np.testing.assert_array_equal(selected.indices, expected.indices)
    transposed = selected.transpose()
    expected_t = expected.T.tocsr()
    np.testing.assert_array_equal(transposed.indptr, expected_t.indptr)
    np.testing.assert_array_equal(transposed.indices, expected_t.indices)
    np.testing.assert_array_equal(transposed.data, expected_t.data)
    empty = CSRArrays.of(matrix).select(np.zeros(0, np.int64), col_map, cols.shape[0])
    assert empty.shape == (0, cols.shape[0]) and empty.indptr.tolist() == [0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_product_matches_scipy_and_its_autograd_uses_the_transpose(dtype):
    """CSRArrays.matmul calls scipy's CSR kernel directly (no csr_matrix per call): the same
    values as csr_matrix @ dense, bit for bit, with empty rows, a non-contiguous input, and a
    wrong inner size refused; SparseOperator's backward is the transpose's product."""
    from mpifgl.graph import CSRArrays, SparseOperator
    numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
    matrix = sp.random(50, 30, density=0.08, format="csr", random_state=3, dtype=numpy_dtype)
    matrix[7] = 0  # an empty row
    matrix.eliminate_zeros()
    arrays = CSRArrays.of(matrix).with_dtype(dtype)
    dense = np.random.default_rng(4).standard_normal((12, 30)).astype(numpy_dtype).T  # 30 x 12, F-order
    got = arrays.matmul(dense)
    assert got.dtype == numpy_dtype and got.shape == (50, 12) and not got[7].any()
    np.testing.assert_array_equal(got, matrix @ np.ascontiguousarray(dense))
    with pytest.raises(ValueError, match="50 x 30 matrix with 29 rows"):
        arrays.matmul(dense[:29])
    operator = SparseOperator(matrix, dtype)
    y = torch.from_numpy(np.ascontiguousarray(dense)).requires_grad_(True)
    out = operator @ y
    np.testing.assert_array_equal(out.detach().numpy(), got)
    weights = torch.from_numpy(np.random.default_rng(5).standard_normal((50, 12)).astype(numpy_dtype))
    (out * weights).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), matrix.T.tocsr() @ weights.numpy())


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
