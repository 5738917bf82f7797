"""The GNN backbones as plain torch modules, and the one propagation every layer uses.

A graph layer computes, for the rows of one operator (a client's sample, or its whole graph),

    H = row_scale * (A_ii y + sum_{j != i} A_ij y_j) + (the layer's own terms),  y = col_scale * M(z)

where M(z) is the transform the layer propagates. ``GraphLayer.propagate`` computes the first
part; each backbone says only what M is, what it adds, and its scales (``scales(degree, p)``).
The model knows nothing of MPI: the cross-client sum is a hook (``CrossSum``) that a method
attaches to the layers' propagations (``mpifgl.exchange.CrossClientSums``); without one the
propagation is the inner block alone (one process, the whole graph as one client).

Parameter names follow PyG so a state_dict loads into PyG convs stacked in a ModuleList called
``layers``: GCN layer -> ``layers.{l}.lin.weight`` [out, in] and ``layers.{l}.bias`` (GCNConv);
1-GNN layer -> ``layers.{l}.lin_rel.weight``, ``layers.{l}.lin_rel.bias``,
``layers.{l}.lin_root.weight`` (GraphConv); SAGE layer -> ``layers.{l}.lin_l.weight``,
``layers.{l}.lin_l.bias``, ``layers.{l}.lin_r.weight`` (SAGEConv).

Adding a backbone: a ``GraphLayer`` subclass here and one line in ``mpifgl.registry.BACKBONES``.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import numpy as np
import torch
from torch import nn

from mpifgl.operators import SparseFeatures, SparseOperator, numpy_dtype
from mpifgl.registry import BACKBONES, lookup

Features = "torch.Tensor | SparseFeatures"


@dataclass
class LayerOperator:
    """Everything one layer's propagation needs on one client for one sample (or the full graph).

    rows: local indices of the output rows (the sample); row_scale/col_scale/self_scale: [k, 1];
    ``exchange``: the cross-client plan (opaque to the model: only its CrossSum reads it), None
    where nothing is exchanged."""

    rows: torch.Tensor  # int64 [k]
    inner: SparseOperator  # A_ii[S_i, S_i]
    row_scale: torch.Tensor
    col_scale: torch.Tensor
    self_scale: torch.Tensor
    exchange: Any = None
    # --exact-first-layer: the first layer's propagation of its input over EVERY neighbour,
    # row_scale * (A (col_scale * x)) with p = 1, for the rows [k, in_dim] (a sampled step's
    # copy, which its training forward overwrites); None: propagated
    input_aggregate: torch.Tensor | None = None
    # the first layer's self term is in ``input_aggregate`` already (``GraphLayer.fold_self_term``,
    # done once): that sum is the layer's whole input, dropped with one mask, and x is not kept
    input_has_self: bool = False
    # --history-every: for each layer above the first, (its input and that input's exact
    # aggregate, as of the last refresh) for the rows; the layer samples only the change since
    history: list[tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Scales:
    """A backbone's normalisation of one propagation, per output row ([k] float64 each): the
    row scale outside the sum, the column scale of each neighbour's message (1/p(u) included)
    and the scale of the node's own transformed row (GCN's self loop; 0 when the layer has none)."""

    row: torch.Tensor
    col: torch.Tensor
    self: torch.Tensor


class CrossSum(Protocol):
    """The sum over other clients of their terms for this client's rows, attached to one
    propagation of one layer (collective: every rank calls it, in the same order)."""

    def propagate(self, inner: Any, plan: Any, y: torch.Tensor) -> torch.Tensor:
        """inner @ y + the sum, [k, d] -> [k, d], with autograd (backward: the inner block's
        transpose and the same sum of the gradient); ``inner`` a ``SparseOperator``."""
        ...

    def add_into(self, plan: Any, y: torch.Tensor, total: torch.Tensor) -> None:
        """total += the sum, in place and without autograd (the evaluation's forward)."""
        ...


def linear(z: Features, weight: torch.Tensor) -> torch.Tensor:
    """z W^T for a dense tensor or SparseFeatures (no bias)."""
    if isinstance(z, SparseFeatures):
        return z.linear(weight)
    return z @ weight.T


def _glorot(weight: torch.Tensor, generator: torch.Generator) -> None:
    bound = math.sqrt(6.0 / (weight.shape[0] + weight.shape[1]))
    with torch.no_grad():
        weight.copy_(torch.rand(weight.shape, generator=generator, dtype=torch.float64)
                     .mul_(2 * bound).sub_(bound).to(weight.dtype))


def _add(total: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """total + term, in place: ``total`` is a sum the layer has just computed, which no
    autograd node saved (an addition's gradient needs neither operand), so training writes
    no fresh [k, d] tensor either. The same rounding as total + term."""
    return total.add_(term)


class GraphLayer(nn.Module):
    """One graph layer. Subclasses give ``scales``, ``message`` (M: the transform propagated)
    and ``update`` (what is added to the propagation). ``propagated_widths`` lists the width of
    each ``propagate`` call of one forward, in call order: the cross-client sums it runs, from
    which every rank learns the schedule (``mpifgl.exchange.CrossClientSums``).

    Evaluation (autograd off) runs every sum in place and does not hold M(z) through the
    exchange (``update`` recomputes it): a full-graph layer then holds two [n_i, d] tensors at a
    time besides its input. Training keeps M(z): autograd sums its two gradients before the one
    weight product, as a single use would."""

    def __init__(self) -> None:
        super().__init__()
        self.cross_sums: list[CrossSum] = []  # one per propagation; empty: inner block only

    @staticmethod
    def scales(degree: torch.Tensor, probability: torch.Tensor) -> Scales:
        """degree: float64 [k] whole-graph degrees without self loop; probability: float64 [k]
        inclusion probabilities p(u) (1 without sampling)."""
        raise NotImplementedError

    @property
    def out_dim(self) -> int:
        raise NotImplementedError

    def propagated_widths(self) -> list[int]:
        return [self.out_dim]

    def message(self, z: Features) -> torch.Tensor:
        raise NotImplementedError

    def update(self, aggregated: torch.Tensor, z: Features, message: torch.Tensor | None,
               op: LayerOperator) -> torch.Tensor:
        """The layer's output from ``aggregated`` = propagate(col_scale * message); ``message``
        is None in evaluation (recompute it if needed)."""
        raise NotImplementedError

    def propagate(self, y: torch.Tensor, op: LayerOperator, index: int = 0) -> torch.Tensor:
        """row_scale * (A_ii y + sum_{j != i} A_ij y_j): the cross-client sum through this
        layer's ``index``-th hook, if one is attached and the operator has a plan."""
        # a fresh tensor that no autograd node saves, the cross-client sum added into it in place
        cross_sum = self.cross_sums[index] if self.cross_sums and op.exchange is not None else None
        if cross_sum is not None and torch.is_grad_enabled():
            total = cross_sum.propagate(op.inner, op.exchange, y)
        else:
            total = op.inner @ y
            if cross_sum is not None:
                cross_sum.add_into(op.exchange, y, total)
        return total.mul_(op.row_scale)  # the scale takes no gradient: total is not saved

    def forward(self, z: Features, op: LayerOperator) -> torch.Tensor:
        if torch.is_grad_enabled():
            message = self.message(z)
            return self.update(self.propagate(message * op.col_scale, op), z, message, op)
        y = self.message(z).mul_(op.col_scale)
        aggregated = self.propagate(y, op)
        del y  # before update recomputes M(z): two [k, d] tensors at a time
        return self.update(aggregated, z, None, op)

    def forward_with_history(self, z: torch.Tensor, change: torch.Tensor, past: torch.Tensor,
                             op: LayerOperator) -> torch.Tensor:
        """The layer with a control variate (VR-GCN): the sampled propagation of ``change`` =
        z - (the input at the last refresh) plus ``past``, that input's exact aggregate. M is
        linear, so this is the propagation of M(z) whenever the sample's estimate of the change's
        is; dropout, if any, has been applied to z and to the change with one mask."""
        message = self.message(z) if torch.is_grad_enabled() else None
        sampled = self.propagate(self.message(change) * op.col_scale, op)
        return self.update(_add(sampled, self.message(past)), z, message, op)

    def forward_aggregated(self, z: Features, aggregate: torch.Tensor, op: LayerOperator,
                           in_place: bool = False) -> torch.Tensor:
        """The layer on an input whose propagation is done: ``aggregate`` = row_scale * (A
        (col_scale * z)). M is linear, so the propagation of M(z) is M of the aggregate.
        ``in_place``: ``aggregate`` is a copy for this call alone, which the layer may
        overwrite."""
        message = self.message(z) if torch.is_grad_enabled() else None
        return self.update(self.message(aggregate), z, message, op)

    def fold_self_term(self, aggregate: torch.Tensor, z: Features,
                       op: LayerOperator) -> bool:
        """Add the self term into ``aggregate`` (in place) where the layer is one transform of
        their sum, so that ``forward_folded`` needs no z; False where it is not (a weight of
        its own for the root)."""
        return False

    def forward_folded(self, combined: torch.Tensor) -> torch.Tensor:
        """The layer on ``fold_self_term``'s sum."""
        raise NotImplementedError(f"{type(self).__name__} has no folded first layer")


class GCNLayer(GraphLayer):
    """H = D~^-1/2 (A + I) D~^-1/2 Z W^T + b, propagation after the transform (PyG GCNConv).

    Shapes: z [k, in_dim] -> [k, out_dim]."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    @staticmethod
    def scales(degree: torch.Tensor, probability: torch.Tensor) -> Scales:
        dinv = 1.0 / torch.sqrt(degree + 1.0)  # d~ = degree + self loop
        return Scales(dinv, dinv / probability, dinv * dinv)

    @staticmethod
    def pyg_conv(in_dim: int, out_dim: int) -> nn.Module:
        """The PyG conv computing this layer on pre-normalised edge weights (self loops as
        edges weighted by the self scale): GraphSAINT's layer."""
        from torch_geometric.nn import GCNConv
        return GCNConv(in_dim, out_dim, normalize=False, add_self_loops=False)

    @property
    def out_dim(self) -> int:
        return self.lin.out_features

    def reset(self, generator: torch.Generator) -> None:
        _glorot(self.lin.weight, generator)
        nn.init.zeros_(self.bias)

    def message(self, z: Features) -> torch.Tensor:
        return linear(z, self.lin.weight)

    def update(self, aggregated, z, message, op):
        own = op.self_scale * message if message is not None else \
            linear(z, self.lin.weight).mul_(op.self_scale)
        return _add(_add(aggregated, own), self.bias)

    def forward_aggregated(self, z: Features, aggregate: torch.Tensor, op: LayerOperator,
                           in_place: bool = False) -> torch.Tensor:
        """(aggregate + self_scale * z) W^T + b: the propagation and the self term share the
        weight, so one product of their sum (written over ``aggregate`` where ``in_place``),
        whose autograd keeps one [k, in] input where two products kept both and held two
        [k, out] results beside the output."""
        if isinstance(z, SparseFeatures):
            return super().forward_aggregated(z, aggregate, op)
        combined = (aggregate.addcmul_(op.self_scale, z) if in_place
                    else torch.addcmul(aggregate, op.self_scale, z))
        return self.forward_folded(combined)

    def fold_self_term(self, aggregate: torch.Tensor, z: Features,
                       op: LayerOperator) -> bool:
        aggregate.addcmul_(op.self_scale, z.dense() if isinstance(z, SparseFeatures) else z)
        return True

    def forward_folded(self, combined: torch.Tensor) -> torch.Tensor:
        return _add(linear(combined, self.lin.weight), self.bias)


class RootAndNeighbourLayer(GraphLayer):
    """H = z W_root^T + propagate(z W_nbr^T) + b: a node's own row and its propagated
    neighbours with weights of their own (the bias rides with the neighbour weight, as in PyG).
    Subclasses give the scales and name the two linears as their PyG conv does, so a state_dict
    loads into it: ``neighbour`` and ``root`` return them.

    Shapes: z [k, in_dim] -> [k, out_dim]."""

    @property
    def neighbour(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def root(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def out_dim(self) -> int:
        return self.neighbour.out_features

    def reset(self, generator: torch.Generator) -> None:
        _glorot(self.neighbour.weight, generator)
        _glorot(self.root.weight, generator)
        nn.init.zeros_(self.neighbour.bias)

    def message(self, z: Features) -> torch.Tensor:
        return linear(z, self.neighbour.weight)

    def update(self, aggregated, z, message, op):
        return _add(_add(aggregated, self.neighbour.bias), linear(z, self.root.weight))


class OneGNNLayer(RootAndNeighbourLayer):
    """1-GNN (Morris et al.): H = Z W_root^T + A Z W_rel^T + b (PyG GraphConv, aggr='add')."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin_rel = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_root = nn.Linear(in_dim, out_dim, bias=False)

    neighbour = property(lambda self: self.lin_rel)
    root = property(lambda self: self.lin_root)

    @staticmethod
    def scales(degree: torch.Tensor, probability: torch.Tensor) -> Scales:
        return Scales(torch.ones_like(degree), 1.0 / probability, torch.zeros_like(degree))

    @staticmethod
    def pyg_conv(in_dim: int, out_dim: int) -> nn.Module:
        from torch_geometric.nn import GraphConv
        return GraphConv(in_dim, out_dim, aggr="add")


class SAGELayer(RootAndNeighbourLayer):
    """GraphSAGE-mean (Hamilton et al.): H = mean_{u in N(v)} z_u W_l^T + b + z_v W_r^T (PyG
    SAGEConv, aggr='mean', root weight): where GCN mixes a node's own row into its neighbours'
    sum with one weight by degree, here each has its own. A node without neighbours gets its
    own term only."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    neighbour = property(lambda self: self.lin_l)
    root = property(lambda self: self.lin_r)

    @staticmethod
    def scales(degree: torch.Tensor, probability: torch.Tensor) -> Scales:
        mean = torch.where(degree > 0, 1.0 / degree.clamp(min=1), torch.zeros_like(degree))
        return Scales(mean, 1.0 / probability, torch.zeros_like(degree))

    @staticmethod
    def pyg_conv(in_dim: int, out_dim: int) -> nn.Module:
        """SAGEConv summing over edges the caller weighs 1/deg(v) (GraphSAINT's layer)."""
        from torch_geometric.nn import SAGEConv
        return SAGEConv(in_dim, out_dim, aggr="sum")


def layer_type(backbone: str) -> type[GraphLayer]:
    """The layer class of ``--backbone`` (ValueError naming the flag for an unknown one)."""
    return lookup(BACKBONES, "backbone", backbone).load()


RandomStream = "np.random.Generator | torch.Generator"


def uniform_draws(shape: tuple[int, ...], rng: RandomStream) -> torch.Tensor:
    """float32 uniform draws in [0, 1) from a rank's reproducible, checkpointed stream, on the
    stream's device: numpy's PCG64 on the CPU (torch's CPU mt19937 draws much slower,
    docs/training.md), a torch generator on a GPU (the draws are made where they are used)."""
    if isinstance(rng, torch.Generator):
        return torch.rand(shape, generator=rng, dtype=torch.float32, device=rng.device)
    return torch.from_numpy(rng.random(shape, dtype=np.float32))


# Fewer draws than this are made on one thread: a thread costs more than it saves.
PARALLEL_DRAWS = 1 << 20
# draws per block of one dropout mask (a float32 block and its comparison fit in L2)
DRAW_BLOCK = 1 << 15


def dropout_mask(rng: np.random.Generator, shape: tuple[int, ...], p: float, dtype: type,
                 threads: int, times: np.ndarray | None = None,
                 into_times: bool = False) -> np.ndarray:
    """0 or 1/(1-p) in ``dtype``, kept where a float32 uniform draw of ``rng`` is >= p; with
    ``times`` (an array of ``shape``) the mask multiplied by it, in the same pass, and with
    ``into_times`` written over ``times`` itself (C-contiguous, of ``dtype``): no array of the
    mask's size at all. With
    ``threads`` > 1 a PCG64 stream is cut into consecutive pieces (``advance``: two float32
    draws per 64-bit step), each drawn and compared on its own thread (numpy releases the GIL):
    the same numbers, and ``rng`` left in the same state, as one thread
    (tests/unit/mpifgl/test_model.py)."""
    n = math.prod(shape)
    scale = np.dtype(dtype).type(1.0 / (1.0 - p))
    flat_times = None if times is None else np.ascontiguousarray(times, dtype=dtype).reshape(-1)
    if into_times and (flat_times is None or not np.shares_memory(flat_times, times)):
        raise ValueError(f"dropout_mask(into_times=True) needs times, a C-contiguous array of "
                         f"{np.dtype(dtype).name}")
    mask = flat_times if into_times else np.empty(n, dtype=dtype)

    def piece(generator: np.random.Generator, start: int, stop: int) -> None:
        # in blocks that stay in cache, drawn into small buffers: no temporary arrays of
        # the mask's size (the generator's stream is the same however its draws are split)
        draws = np.empty(min(DRAW_BLOCK, stop - start), dtype=np.float32)
        keep = np.empty(draws.shape[0], dtype=bool)
        values = np.empty(draws.shape[0], dtype=dtype) if into_times else None
        for first in range(start, stop, DRAW_BLOCK):
            last = min(first + DRAW_BLOCK, stop)
            block = draws[:last - first]
            generator.random(out=block, dtype=np.float32)
            np.greater_equal(block, p, out=keep[:last - first])
            if into_times:  # the same mask * times, stored over times
                np.multiply(keep[:last - first], scale, out=values[:last - first])
                np.multiply(values[:last - first], flat_times[first:last], out=mask[first:last])
                continue
            np.multiply(keep[:last - first], scale, out=mask[first:last])
            if flat_times is not None:
                np.multiply(mask[first:last], flat_times[first:last], out=mask[first:last])

    state = rng.bit_generator.state
    pieces = min(threads, n // PARALLEL_DRAWS)
    if pieces < 2 or n % 2 or state["bit_generator"] != "PCG64" or state["has_uint32"]:
        piece(rng, 0, n)
        return mask.reshape(shape)
    step = n // pieces // 2 * 2  # even: a piece starts on a whole 64-bit step
    bounds = [k * step for k in range(pieces)] + [n]
    generators = []
    for start in bounds[:-1]:
        bit_generator = np.random.PCG64()
        bit_generator.state = state
        bit_generator.advance(start // 2)
        generators.append(np.random.Generator(bit_generator))
    with ThreadPoolExecutor(pieces) as pool:
        list(pool.map(piece, generators, bounds[:-1], bounds[1:]))
    rng.bit_generator.state = generators[-1].bit_generator.state  # where one thread would end
    return mask.reshape(shape)


def dropout_scale(z: torch.Tensor, p: float, rng: RandomStream) -> torch.Tensor | None:
    """The mask ``dropout`` multiplies a dense z by: 0 or 1/(1-p) in z's dtype, on z's device,
    from the same draws; None where it draws none (p = 0 or an empty z)."""
    if p <= 0.0 or z.numel() == 0:
        return None
    # A mask already in z's dtype holding 0 or 1/(1-p) rounds exactly as z * 1 * (1/(1-p)) and
    # avoids the type promotion of a bool mask and a second pass.
    if isinstance(rng, np.random.Generator):  # the mask in numpy: faster than torch's (docs)
        mask = dropout_mask(rng, tuple(z.shape), p, numpy_dtype(z.dtype), torch.get_num_threads())
        return torch.from_numpy(mask).to(z.device)
    keep = uniform_draws(tuple(z.shape), rng) >= p
    return keep.to(z.dtype).mul_(1.0 / (1.0 - p))


def dropout(z: Features, p: float, rng: RandomStream, in_place: bool = False) -> Features:
    """Inverted dropout drawn from ``rng`` (``uniform_draws``). ``in_place``: z is a copy its
    caller made for this one use, so where it takes no gradient the masked values overwrite it
    (the same products, no second tensor of its size)."""
    if isinstance(z, SparseFeatures):
        return z.dropout(p, uniform_draws((z.nnz,), rng)) if p > 0.0 else z
    if p <= 0.0 or z.numel() == 0:
        return z
    in_place = in_place and not z.requires_grad and z.is_contiguous()
    if isinstance(rng, np.random.Generator) and not z.requires_grad and z.device.type == "cpu":
        # an input that takes no gradient (the features): masked in the mask's own buffer, or
        # in its own, on the rank's threads, with no second array of its size (the same products)
        masked = dropout_mask(rng, tuple(z.shape), p, numpy_dtype(z.dtype),
                              torch.get_num_threads(), times=z.numpy(), into_times=in_place)
        return z if in_place else torch.from_numpy(masked)
    if in_place:
        return z.mul_(dropout_scale(z, p, rng))
    return z * dropout_scale(z, p, rng)


class _ReluDropout(torch.autograd.Function):
    """relu(h) then inverted dropout, in place on h (a layer's fresh output, which no autograd
    node saved), keeping only the result for backward: where it is positive the gradient passes
    times the mask's scale, elsewhere not. Relu then dropout as two operations keep the relu's
    result, the mask and the product, three [k, d] tensors of every hidden layer until backward;
    this keeps one, which the next layer's weight product saves anyway, and its backward writes
    the input gradient over it: the result must not be read after backward (a layer's input
    inside a model, which nothing outside reads). The same numbers, from the same draws
    (``dropout_mask``), as relu then ``dropout``, except that a gradient of 0 may be -0 and a
    non-finite incoming gradient stays non-finite where relu cut it (``mpifgl.finite`` stops)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, p: float,  # type: ignore[override]
                rng: RandomStream | None) -> torch.Tensor:
        out = h.clamp_(min=0)
        dropped = rng is not None and p > 0.0 and out.numel() > 0
        if dropped:  # detached: ``dropout`` masks a tensor without gradient in place
            masked = dropout(out.detach(), p, rng, in_place=True)
            if masked.data_ptr() != out.data_ptr():  # a non-contiguous out got a masked copy
                out.copy_(masked)
        ctx.mark_dirty(h)
        ctx.save_for_backward(out)
        # the scale as the mask holds it (rounded to the tensor's type): the same products
        ctx.scale = float(numpy_dtype(out.dtype)(1.0 / (1.0 - p))) if dropped else None
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        # written over the result: by now every later node that saved it has run, and a [k, d]
        # gradient and a boolean mask allocated here would be the backward pass's peak
        (out,) = ctx.saved_tensors
        passed = out.sign_().mul_(grad)  # out >= 0: 1 where positive, 0 elsewhere
        return (passed if ctx.scale is None else passed.mul_(ctx.scale)), None, None


def relu_dropout(h: torch.Tensor, p: float, rng: RandomStream | None) -> torch.Tensor:
    """relu(h), then dropout drawn from ``rng`` where one is given, in place on ``h``: a layer's
    fresh output that nothing else holds. Backward keeps only the result and writes the gradient
    over it (``_ReluDropout``)."""
    return _ReluDropout.apply(h, p, rng)


class GNN(nn.Module):
    """A stack of ``layers`` graph layers of one backbone, ReLU between them, none on the last."""

    def __init__(self, backbone: str, in_dim: int, hidden: int, out_dim: int, layers: int,
                 dropout_p: float, seed: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.layer_type = layer_type(backbone)
        widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList(self.layer_type(widths[k], widths[k + 1])
                                    for k in range(layers))
        self.dropout_p = dropout_p
        self.widths = widths
        # Same seed -> same initial weights on every rank and in centralized mode.
        generator = torch.Generator().manual_seed(seed)
        for layer in self.layers:
            layer.reset(generator)
        self.to(dtype)

    def forward(self, x: Features, op: LayerOperator, rng: RandomStream | None = None,
                own_input: bool = False) -> torch.Tensor:
        """x: [|S_i|, in_dim] rows of the sample (None where ``op.input_has_self``); returns
        logits [|S_i|, out_dim].
        Dropout applies when ``rng`` is given (training) and the model is in train mode.
        ``own_input``: x and ``op.input_aggregate`` are copies made for this one forward (a
        sampled step's rows), so the first layer overwrites them (its dropout, and GCN's
        self term added into the aggregate)."""
        rng = rng if self.training else None
        # a hidden layer's input is dropped with the relu before it, in one step, except with
        # history, whose change since the refresh takes the input's mask too
        fused = op.history is None
        z = x
        for k, layer in enumerate(self.layers):
            z = self._layer(k, layer, z, op, None if fused and k > 0 else rng, own_input)
            if k < len(self.layers) - 1:  # the layer's fresh output, which nothing else holds
                z = relu_dropout(z, self.dropout_p, rng if fused else None)
        return z

    def _layer(self, k: int, layer: GraphLayer, z: Features, op: LayerOperator,
               rng: RandomStream | None, own_input: bool = False) -> torch.Tensor:
        """Layer k on its input z, with dropout where ``rng`` is given (in place on the first
        layer's inputs where they are ``own_input``; ``forward`` drops a hidden layer's input
        with its relu and gives no ``rng`` then)."""
        if k > 0 and op.history is not None:
            past_input, past_aggregate = op.history[k - 1]
            change = z - past_input
            mask = dropout_scale(z, self.dropout_p, rng) if rng is not None else None
            if mask is not None:  # one mask for the input and its change
                z, change = z * mask, change * mask
            return layer.forward_with_history(z, change, past_aggregate, op)
        in_place = own_input and k == 0
        if k == 0 and op.input_has_self:  # z is None: the aggregate is the whole input
            combined = op.input_aggregate
            if rng is not None:
                combined = dropout(combined, self.dropout_p, rng, in_place)
            return layer.forward_folded(combined)
        if rng is not None:
            z = dropout(z, self.dropout_p, rng, in_place)
        if k == 0 and op.input_aggregate is not None:
            aggregate = op.input_aggregate
            if rng is not None:  # the aggregate's own draws: it replaces the input's propagation
                aggregate = dropout(aggregate, self.dropout_p, rng, in_place)
            return layer.forward_aggregated(z, aggregate, op, in_place)
        return layer(z, op)


def make_features(x: np.ndarray, dtype: torch.dtype, feature_format: str = "auto",
                  max_density: float = 0.1, device: torch.device | str = "cpu") -> Features:
    """A shard's features as a dense tensor on ``device``, or (on the CPU) SparseFeatures when
    sparse enough to pay off. A GPU takes bag-of-words features dense: its dense products are
    faster than a sparse one of float64 accumulation."""
    dense = torch.from_numpy(np.asarray(x)).to(dtype)
    if torch.device(device).type != "cpu":
        if feature_format == "sparse":
            raise ValueError(f"--feature-format sparse runs on the CPU only; expected dense or "
                             f"auto with --device {device}")
        return dense.to(device)
    density = int(torch.count_nonzero(dense)) / max(1, dense.numel())
    if feature_format == "sparse" or (feature_format == "auto" and density <= max_density):
        return SparseFeatures.of_dense(dense)
    return dense


def select_rows(features: Features, rows: torch.Tensor) -> Features:
    if isinstance(features, SparseFeatures):
        return features.rows(rows)
    # index_select: several times cheaper than features[rows] (docs/training.md, "One step")
    return torch.index_select(features, 0, rows)


# -- flat vectors: one message of all gradients or parameters ---------------------------------
def flatten(tensors: Iterable[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """One contiguous 1-D tensor of ``tensors`` end to end (in ``dtype`` if given)."""
    parts = [t.detach().reshape(-1) for t in tensors]
    flat = torch.cat(parts) if parts else torch.zeros(0)
    return flat if dtype is None else flat.to(dtype)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter's gradient, zeros where it has none (model.parameters() order)."""
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pieces of ``flat`` shaped and typed as ``like`` (fresh tensors)."""
    total = sum(tensor.numel() for tensor in like)
    if total != flat.shape[0]:
        raise ValueError(f"a flat vector of {flat.shape[0]} values for tensors of {total}")
    pieces, position = [], 0
    for tensor in like:
        count = tensor.numel()
        pieces.append(flat[position:position + count].view_as(tensor).to(tensor.dtype,
                                                                           copy=True))
        position += count
    return pieces
