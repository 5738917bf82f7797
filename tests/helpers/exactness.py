"""The references of the exactness tests: the program's centralized mode and PyG on the same
weights, the probe's fixed sample, and the probe launcher (tests/helpers/mpi_scripts).

The distributed run (``run_probe``) must equal both references: 1e-10 in float64, 1e-5 in float32.
"""
from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from fgl_common.arrays import offsets as fgl_offsets
from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.model import flatten, gradients
from mpifgl.registry import BACKBONES
from mpifgl.sampling import NodeSample
from tests.helpers.graphs import Graph, random_graph, random_parts
from tests.helpers.mpi import MPI_SCRIPTS, run_mpi

PROBE = str(MPI_SCRIPTS / "probe_exactness.py")
SAMPLE_KEEP = 0.6


def fixed_sample(client_sizes) -> list[NodeSample]:
    """Every client's sample: each node kept with probability SAMPLE_KEEP (seeded), p = 0.6."""
    rng = np.random.default_rng(123)
    samples = []
    for n_j in client_sizes:
        index = np.flatnonzero(rng.random(int(n_j)) < SAMPLE_KEEP).astype(np.int64)
        samples.append(NodeSample(index, np.full(index.shape[0], SAMPLE_KEEP)))
    return samples


# A cap of a few rows (4 float64 rows of the widest layer, 16) makes every exchange many chunks;
# one-row chunks (any cap below a row) work too but cost minutes under mpirun on 2 cores.
TINY_MB = 4 * 16 * 8 / 2 ** 20


TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
CASES = [(b, d) for b in BACKBONES for d in ("float64", "float32")]


def gather_in_global_order(comm, logits: np.ndarray, global_id: np.ndarray):
    """Every rank's logits rows (the server's: none) at the server in ascending global id ->
    (logits, global ids); (None, None) elsewhere."""
    parts = comm.gatherv_rows(torch.from_numpy(np.ascontiguousarray(logits)))
    ids = comm.gatherv_rows(torch.from_numpy(global_id[:, None].astype(np.int64)))
    if not comm.is_server:
        return None, None
    order = np.concatenate([p[:, 0].numpy() for p in ids])
    ordering = np.argsort(order)
    return np.concatenate([p.numpy() for p in parts])[ordering], order[ordering]


def flat_grads(model) -> np.ndarray:
    """Every parameter's gradient end to end (zeros where none)."""
    return flatten(gradients(model)).cpu().numpy()


def operator_logits(comm, gnn, operator, num_classes: int) -> np.ndarray:
    """After a step on ``operator``: this client's logits of the operator's rows (eval mode,
    float64); the server runs its side of the forward's exchanges and has no rows."""
    gnn.start_pass("eval")
    if not comm.is_client:
        gnn.cross_sums.server_pass(operator.exchange, backward=False)
        return np.zeros((0, num_classes))
    gnn.model.eval()
    with torch.no_grad():
        return gnn.model(gnn.input_rows(operator), unspent(gnn, operator)
                         ).detach().cpu().numpy().astype(np.float64)


def unspent(gnn, operator):
    """``operator`` as before its training step, which overwrote the step's copy of the input
    aggregate's rows (--exact-first-layer): a fresh copy of them."""
    if gnn.input_aggregate is None or operator.input_aggregate is None:
        return operator
    return dataclasses.replace(operator, input_aggregate=torch.index_select(
        gnn.input_aggregate, 0, operator.rows))


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
    offsets = fgl_offsets(manifest.client_sizes())
    merged = NodeSample(np.concatenate([offsets[j] + s.index for j, s in enumerate(samples)]),
                        np.concatenate([s.probability for s in samples]))
    operator, train_rows = gnn.operator_for_sample(merged)
    loss = gnn.loss_and_gradients(operator, train_rows)
    gnn.model.eval()
    logits = gnn.model(gnn.input_rows(operator),
                       unspent(gnn, operator)).detach().numpy()
    rows = operator.rows.numpy()
    order = np.argsort(graph.global_id[rows])
    return loss, flat_grads(gnn.model), logits[order], graph.global_id[rows][order]


def pyg_reference(graph: Graph, state_dict, backbone: str, dtype: str, layers: int):
    """Independent implementation: PyG convs on the original graph with the same weights."""
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    widths = [graph.x.shape[1]] + [16] * (layers - 1) + [graph.num_classes]
    conv = {"gcn": GCNConv, "1gnn": GraphConv, "sage": SAGEConv}[backbone]  # PyG's defaults
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


def check_against_references(graph: Graph, shard_dir, layers: int, probe_file, cases=CASES):
    results = np.load(probe_file)
    for backbone, dtype in cases:
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


def variant_output(out, mode: str) -> Path:
    """Where a probe of several exchange modes writes ``mode``'s results: OUT-MODE.npz."""
    out = Path(out)
    return out.with_name(f"{out.stem}-{mode}{out.suffix}")


def run_probe(shard_dir, out, ranks: int, layers: int, mode: str = "compact",
              buffer_mb: float = 256.0, device: str = "cpu", secure: bool = False,
              cases=CASES, launch=run_mpi):
    """The probe under ``launch(ranks, argv, timeout=...)`` (default: ``mpirun`` on this host);
    ``mode``: one exchange mode (returns its results) or several joined by commas (returns
    None; each is in ``variant_output(out, mode)``)."""
    done = launch(ranks, [PROBE, str(shard_dir), str(out), str(layers), mode, str(buffer_mb),
                          device, "1" if secure else "0",
                          ",".join(f"{b}_{d}" for b, d in cases)], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out) if "," not in mode else None


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
