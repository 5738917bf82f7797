"""The GNN backbones as plain torch modules whose propagation goes through a LayerOperator.

Parameter names follow PyG so a state_dict loads into PyG convs stacked in a ModuleList called
``layers``: GCN layer -> ``layers.{l}.lin.weight`` [out, in] and ``layers.{l}.bias`` (GCNConv);
1-GNN layer -> ``layers.{l}.lin_rel.weight``, ``layers.{l}.lin_rel.bias``,
``layers.{l}.lin_root.weight`` (GraphConv). No MPI here: the cross-client sum is a callable.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from mpifgl.exchange import ExchangeFn, add_cross_client_sum, cross_client_sum
from mpifgl.graph import LayerOperator, numpy_dtype


class SparseFeatures:
    """Rows of a sparse (bag-of-words) input matrix. The first layer multiplies it without ever
    densifying: on Cora or Coauthor CS (about 1% non-zeros) that is most of an epoch's FLOPs.
    Products are accumulated in float64 and rounded once to ``dtype``: as accurate as a dense
    BLAS product, so float32 runs agree with other implementations to float32 precision."""

    def __init__(self, matrix: sp.csr_matrix, dtype: torch.dtype):
        self.matrix = matrix.tocsr().astype(np.float64)
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape

    def rows(self, index: np.ndarray) -> "SparseFeatures":
        return SparseFeatures(self.matrix[index], self.dtype)

    def dropout(self, p: float, rng: np.random.Generator) -> "SparseFeatures":
        """Dropout on the stored entries (dropping a zero changes nothing)."""
        keep = rng.random(self.matrix.nnz, dtype=np.float32) >= p
        data = self.matrix.data * keep / (1.0 - p)
        return SparseFeatures(sp.csr_matrix((data, self.matrix.indices, self.matrix.indptr),
                                            shape=self.matrix.shape), self.dtype)


class _SparseInputLinear(torch.autograd.Function):
    """X W^T for a constant sparse X; backward gives dW = (X^T G)^T."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, features: SparseFeatures):  # type: ignore[override]
        ctx.features = features
        product = features.matrix @ weight.detach().numpy().astype(np.float64).T
        return torch.from_numpy(np.ascontiguousarray(product)).to(weight.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad_weight = ctx.features.matrix.T @ grad.contiguous().numpy().astype(np.float64)
        return torch.from_numpy(np.ascontiguousarray(grad_weight.T)).to(grad.dtype), None


def linear(z, weight: torch.Tensor) -> torch.Tensor:
    """z W^T for a dense tensor or SparseFeatures (no bias)."""
    if isinstance(z, SparseFeatures):
        return _SparseInputLinear.apply(weight, z)
    return z @ weight.T


def select_rows(features, rows: np.ndarray):
    if isinstance(features, SparseFeatures):
        return features.rows(rows)
    # index_select: several times cheaper than features[rows] (docs/training.md, "One step")
    return torch.index_select(features, 0, torch.from_numpy(rows))


def make_features(x: np.ndarray, dtype: torch.dtype, feature_format: str = "auto",
                  max_density: float = 0.1):
    """Dense tensor, or SparseFeatures when the matrix is sparse enough to pay off."""
    x = np.asarray(x, dtype=numpy_dtype(dtype))
    density = np.count_nonzero(x) / max(1, x.size)
    if feature_format == "sparse" or (feature_format == "auto" and density <= max_density):
        return SparseFeatures(sp.csr_matrix(x), dtype)
    return torch.from_numpy(x)


def _glorot(weight: torch.Tensor, generator: torch.Generator) -> None:
    bound = math.sqrt(6.0 / (weight.shape[0] + weight.shape[1]))
    with torch.no_grad():
        weight.copy_(torch.rand(weight.shape, generator=generator, dtype=torch.float64)
                     .mul_(2 * bound).sub_(bound).to(weight.dtype))


class GCNLayer(nn.Module):
    """H = D~^-1/2 (A + I) D~^-1/2 Z W^T + b, propagation after the transform (PyG GCNConv)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def reset(self, generator: torch.Generator) -> None:
        _glorot(self.lin.weight, generator)
        nn.init.zeros_(self.bias)

    def forward(self, z: torch.Tensor, op: LayerOperator, exchange: ExchangeFn | None) -> torch.Tensor:
        o = linear(z, self.lin.weight)
        y = o * op.col_scale
        if not torch.is_grad_enabled():
            # Evaluation: the same operations in the same order (same roundings), in place, and
            # o recomputed for the self term instead of held through the exchange, so a
            # full-graph forward holds two [n_i, d] tensors at a time besides its input.
            del o
            agg = op.inner @ y
            if op.exchange is not None and exchange is not None:
                add_cross_client_sum(agg, y, op.exchange, exchange)
            del y
            agg *= op.row_scale
            agg += linear(z, self.lin.weight).mul_(op.self_scale)
            return agg.add_(self.bias)
        agg = op.inner @ y
        if op.exchange is not None and exchange is not None:
            agg = agg + cross_client_sum(y, op.exchange, exchange)
        return op.row_scale * agg + op.self_scale * o + self.bias


class OneGNNLayer(nn.Module):
    """1-GNN (Morris et al.): H = Z W_root^T + A Z W_rel^T + b (PyG GraphConv, aggr='add')."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin_rel = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_root = nn.Linear(in_dim, out_dim, bias=False)

    def reset(self, generator: torch.Generator) -> None:
        _glorot(self.lin_rel.weight, generator)
        _glorot(self.lin_root.weight, generator)
        nn.init.zeros_(self.lin_rel.bias)

    def forward(self, z: torch.Tensor, op: LayerOperator, exchange: ExchangeFn | None) -> torch.Tensor:
        o = linear(z, self.lin_rel.weight)
        y = o * op.col_scale
        agg = op.inner @ y
        if not torch.is_grad_enabled():  # evaluation: in place, as in GCNLayer
            del o
            if op.exchange is not None and exchange is not None:
                add_cross_client_sum(agg, y, op.exchange, exchange)
            del y
            agg *= op.row_scale
            agg += self.lin_rel.bias
            return agg.add_(linear(z, self.lin_root.weight))
        if op.exchange is not None and exchange is not None:
            agg = agg + cross_client_sum(y, op.exchange, exchange)
        return op.row_scale * agg + self.lin_rel.bias + linear(z, self.lin_root.weight)


LAYERS = {"gcn": GCNLayer, "1gnn": OneGNNLayer}


def dropout(z, p: float, rng: np.random.Generator):
    """Inverted dropout drawn from an explicit numpy stream, so every rank's stream is
    reproducible and checkpointed. numpy's PCG64 rather than a torch.Generator: torch's CPU
    mt19937 draws much slower (docs/training.md)."""
    if isinstance(z, SparseFeatures):
        return z.dropout(p, rng) if p > 0.0 else z
    if p <= 0.0 or z.numel() == 0:
        return z
    keep = rng.random(tuple(z.shape), dtype=np.float32) >= p
    # One multiply by a mask already in z's dtype holding 0 or 1/(1-p), which rounds exactly
    # as z * 1 * (1/(1-p)) and avoids the type promotion of a bool mask and a second pass.
    mask = keep.astype(numpy_dtype(z.dtype))
    mask *= 1.0 / (1.0 - p)
    return z * torch.from_numpy(mask)


class GNN(nn.Module):
    """A stack of ``layers`` graph layers, ReLU between them, no activation on the last."""

    def __init__(self, backbone: str, in_dim: int, hidden: int, out_dim: int, layers: int,
                 dropout_p: float, seed: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        if backbone not in LAYERS:
            raise ValueError(f"backbone {backbone!r}, expected one of {', '.join(LAYERS)}")
        widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList(LAYERS[backbone](widths[k], widths[k + 1])
                                    for k in range(layers))
        self.dropout_p = dropout_p
        self.widths = widths
        # Same seed -> same initial weights on every rank and in centralized mode.
        generator = torch.Generator().manual_seed(seed)
        for layer in self.layers:
            layer.reset(generator)
        self.to(dtype)

    def forward(self, x: torch.Tensor, op: LayerOperator, exchange: ExchangeFn | None,
                rng: np.random.Generator | None = None) -> torch.Tensor:
        """x: [|S_i|, in_dim] rows of the sample; returns logits [|S_i|, out_dim].
        Dropout applies when ``rng`` is given (training) and the model is in train mode."""
        z = x
        for k, layer in enumerate(self.layers):
            if rng is not None and self.training:
                z = dropout(z, self.dropout_p, rng)
            z = layer(z, op, exchange)
            if k < len(self.layers) - 1:
                z = torch.relu(z) if torch.is_grad_enabled() else torch.relu_(z)
        return z


def flat_grads(model: nn.Module) -> np.ndarray:
    """All parameter gradients in one contiguous buffer of the model's dtype (zeros where
    None): the weight-gradient message is as small as the weights themselves."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
             for p in model.parameters()]
    return torch.cat(parts).numpy().copy()


def set_flat_grads(model: nn.Module, flat: np.ndarray) -> None:
    position = 0
    for p in model.parameters():
        count = p.numel()
        p.grad = torch.from_numpy(flat[position:position + count].copy()).view_as(p).to(p.dtype)
        position += count
