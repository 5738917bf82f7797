"""NeighGen, the missing-neighbour generator of FedSage+ (Zhang, Yang, Liu, Yu, Lv, Zhao, Xue,
"Subgraph Federated Learning with Missing Neighbor Generation", NeurIPS 2021; reference code
zkhku/fedsage, src/models/): the impaired graph and its targets, the encoder, dGen, fGen, the
greedy loss and the mended graph. One client's pieces, no communication: the federated training
of fGen and the mending of the local graph are in ``mpifgl.methods.fedsage``.

As the reference builds them (``LocalSage_Plus``):

* encoder: two graph convolutions F -> h -> latent on the row-normalised D^-1 (A + I) of the
  impaired graph, ReLU after both, dropout between them (none on the input);
* dGen: Linear(latent, 1) + ReLU, the predicted count n^ of hidden neighbours;
* fGen: (z + N(0, 1)) -> 256 -> 2048 (ReLU after each, dropout after the last) -> K F, tanh:
  K generated feature rows per node; the noise is drawn in evaluation too (the reference's
  ``Sampling`` has no evaluation mode);
* classifier: the encoder's architecture F -> h -> C on the impaired graph mended with all K N
  generated rows as nodes, node v joined to its first min(K, floor(n^_v)) (the rest isolated);
  the reference's ReLU on its output is kept;
* greedy loss: for each counted slot j < min(K, floor(n^_v)) of node v with n_v > 0, the least
  MSE (mean over the F features) of the slot against v's first min(K, n_v) hidden neighbours;
  summed and divided by (nodes x K), as the reference's mean over a [nodes, K, F] tensor of
  broadcast values. floor(n^) carries no gradient: dGen learns from the SmoothL1 term only
  (``--neighgen-count-rounding round``: round(n^), FederatedScope's choice).

Departure: the reference's loop takes the min by comparing an MSE with the sum over F of the
current slot's broadcast value (F times it), so for F > 1 it keeps, nearly always, the MSE of
the last of the min(K, n_v) neighbours instead of the least; here the least, as the paper's
equation and the loop's intent say (tests/unit/mpifgl/methods/test_neighgen.py runs the
reference's loop, literal at F = 1, where the two agree).

Initial weights: the reference's ``GraphConvolution`` draws weight and bias from
U(-1/sqrt(out), 1/sqrt(out)); the linear layers torch's default U(-1/sqrt(in), 1/sqrt(in));
here the same distributions from the client's own seeded generator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn as nn
import torch.nn.functional as F

from mpifgl.config import HIDE_RULES
from mpifgl.model import dropout
from mpifgl.operators import SparseOperator


# -- the impaired graph and its targets (numpy) --------------------------------------------------


@dataclass
class ImpairedGraph:
    """G_i^- of one client: its nodes are the client's nodes that were not hidden."""

    kept: np.ndarray  # int64 [n-]: local ids in G_i of G_i^-'s nodes, ascending
    adjacency: sp.csr_matrix  # [n-, n-] 0/1: A_i among the kept nodes
    missing_count: np.ndarray  # int64 [n-]: hidden neighbours of each kept node (n_v)
    train: np.ndarray  # int64: positions in ``kept`` of the training nodes
    # the greedy loss's nodes: positions in ``kept`` of the training nodes with n_v > 0 (the
    # other nodes' terms are 0), and [len(targets), K, F] the features of the first min(K, n_v)
    # of their hidden neighbours, 0 after (a row for every node would be N K F values, the
    # size of all generated rows)
    targets: np.ndarray
    missing_x: np.ndarray
    num_hidden: int  # nodes hidden from G_i


def hide_candidates(train: np.ndarray, val: np.ndarray, test: np.ndarray,
                    rule: str) -> np.ndarray:
    """bool mask of the nodes that may be hidden: ``not-train-test`` = neither training nor test
    nodes (the reference: its clients split 60/20 train/test and hide from the remaining 20%);
    ``val`` = the validation nodes (FederatedScope's and OpenFGL's ``HideGraph``)."""
    if rule == "not-train-test":
        return ~train & ~test
    if rule == "val":
        return val.copy()
    raise ValueError(f"--neighgen-hide-from {rule!r}, expected one of {', '.join(HIDE_RULES)}")


def binary_adjacency(adjacency: sp.spmatrix) -> sp.csr_matrix:
    """The 0/1 pattern of a symmetric adjacency, self loops dropped, indices sorted."""
    pattern = sp.csr_matrix(adjacency, dtype=np.float32, copy=True)
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    pattern.data[:] = 1.0
    pattern.sort_indices()
    return pattern


def impair(adjacency: sp.csr_matrix, x: np.ndarray, train: np.ndarray, candidates: np.ndarray,
           portion: float, num_pred: int, rng: np.random.Generator) -> ImpairedGraph:
    """Hide int(portion * |candidates|) candidate nodes drawn uniformly without replacement
    (the reference's ``wn_hide_subj``) with their edges; targets of every kept node: its count
    of hidden neighbours; of every kept training node with one: the features of the first
    ``num_pred`` of them (ascending local id; the reference takes them in its set's order),
    zero-padded."""
    n = adjacency.shape[0]
    pattern = binary_adjacency(adjacency)
    pool = np.flatnonzero(candidates)
    hidden = np.sort(rng.choice(pool, size=int(pool.shape[0] * portion), replace=False))
    is_hidden = np.zeros(n, dtype=bool)
    is_hidden[hidden] = True
    kept = np.flatnonzero(~is_hidden).astype(np.int64)
    rows = pattern[kept]
    to_hidden = rows[:, hidden].tocsr()
    to_hidden.sort_indices()
    count = np.diff(to_hidden.indptr).astype(np.int64)
    train_positions = np.flatnonzero(train[kept]).astype(np.int64)
    targets = train_positions[count[train_positions] > 0]
    slot = np.arange(num_pred)
    valid = slot[None, :] < count[targets, None]  # [T, K]
    position = to_hidden.indptr[targets, None] + slot[None, :]
    missing_x = np.zeros((targets.shape[0], num_pred, x.shape[1]), dtype=x.dtype)
    missing_x[valid] = x[hidden[to_hidden.indices[position[valid]]]]
    return ImpairedGraph(kept, rows[:, kept].tocsr(), count, train_positions, targets,
                         missing_x, int(hidden.shape[0]))


def row_normalised(adjacency: sp.csr_matrix) -> sp.csr_matrix:
    """D^-1 (A + I) with D the row sums of A + I (the reference's ``normalize``)."""
    with_loops = (adjacency + sp.identity(adjacency.shape[0], dtype=np.float64, format="csr"))
    with_loops = sp.csr_matrix(with_loops, dtype=np.float64)
    inverse = 1.0 / np.asarray(with_loops.sum(axis=1)).ravel()
    result = sp.diags(inverse).dot(with_loops).tocsr()
    result.sort_indices()
    return result


def slot_rows(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node, slot) of every counted slot row, node-major: node b's rows are slots 0..slots[b]-1."""
    slots = np.asarray(slots, dtype=np.int64)
    node = np.repeat(np.arange(slots.shape[0], dtype=np.int64), slots)
    first = np.cumsum(slots) - slots
    return node, np.arange(node.shape[0], dtype=np.int64) - first[node]


def mended_adjacency(adjacency: sp.csr_matrix, slots: np.ndarray, num_pred: int) -> sp.csr_matrix:
    """The impaired graph with all K n generated rows as nodes (node n + K v + s is slot s of
    node v), node v joined to its slots s < slots[v] (the reference's ``MendGraph``): 0/1,
    [(1 + K) n, (1 + K) n]."""
    n = adjacency.shape[0]
    parent, slot = slot_rows(slots)
    child = n + num_pred * parent + slot
    size = (1 + num_pred) * n
    rows = np.concatenate([parent, child])
    cols = np.concatenate([child, parent])
    extra = sp.csr_matrix((np.ones(rows.shape[0], np.float32), (rows, cols)), shape=(size, size))
    base = sp.bmat([[adjacency, None], [None, sp.csr_matrix((size - n, size - n))]], format="csr")
    return (base + extra).tocsr()


def slot_counts(predicted: torch.Tensor, num_pred: int, rounding: str = "floor") -> torch.Tensor:
    """min(K, floor(n^)) as int64, n^ >= 0 (dGen ends in a ReLU): the reference's cast to int and
    clip; ``rounding="round"``: min(K, round(n^)), half to even, as FederatedScope's np.round.
    No gradient."""
    counts = predicted.detach()
    counts = counts.round() if rounding == "round" else counts.floor()
    return counts.clamp(0, num_pred).to(torch.int64)


# -- the greedy loss -----------------------------------------------------------------------------


def greedy_slot_losses(generated: torch.Tensor, true: torch.Tensor, slots: torch.Tensor,
                       true_count: torch.Tensor) -> torch.Tensor:
    """[B, K]: for slot j of node b, counted when j < slots[b] and true_count[b] > 0, the least
    MSE (mean over features) against true[b, k] for k < min(K, true_count[b]); 0 elsewhere.
    generated, true: [B, K, F]; slots, true_count: int64 [B]. One [B, K, K] matrix of MSEs from
    the squared norms and one batched product (no [B, K, K, F] difference)."""
    num_pred, width = generated.shape[1], generated.shape[2]
    squared = (generated * generated).sum(dim=2)  # [B, K]
    true_squared = (true * true).sum(dim=2)
    cross = torch.bmm(generated, true.transpose(1, 2))  # [B, K, K]
    mse = (squared[:, :, None] + true_squared[:, None, :] - 2.0 * cross) / width
    k = torch.arange(num_pred, device=generated.device)
    usable = k[None, None, :] < true_count.clamp(max=num_pred)[:, None, None]
    least = mse.masked_fill(~usable, math.inf).min(dim=2).values
    counted = (k[None, :] < slots[:, None]) & (true_count[:, None] > 0)
    return torch.where(counted, least, torch.zeros_like(least))


def greedy_loss(generated: torch.Tensor, true: torch.Tensor, slots: torch.Tensor,
                true_count: torch.Tensor, num_nodes: int | None = None) -> torch.Tensor:
    """The reference's value: the counted slots' least MSEs summed, over B nodes x K slots.
    ``num_nodes``: B when the rows given are only those of the B nodes with a term (default:
    the rows given)."""
    nodes = generated.shape[0] if num_nodes is None else num_nodes
    if generated.shape[0] == 0 or nodes == 0:
        return generated.sum() * 0.0
    return greedy_slot_losses(generated, true, slots, true_count).sum() / (
        nodes * generated.shape[1])


# -- the model -----------------------------------------------------------------------------------


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator,
             dtype: torch.dtype) -> nn.Parameter:
    """U(-bound, bound), drawn in place (fGen's last layer is the size of the features x 10K)."""
    return nn.Parameter(torch.rand(shape, generator=generator, dtype=dtype)
                        .mul_(2.0 * bound).sub_(bound))


class Linear(nn.Module):
    """x W^T + b with torch's default U(-1/sqrt(in), 1/sqrt(in)) drawn from ``generator``."""

    def __init__(self, in_dim: int, out_dim: int, generator: torch.Generator, dtype: torch.dtype):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)
        self.weight = _uniform((out_dim, in_dim), bound, generator, dtype)
        self.bias = _uniform((out_dim,), bound, generator, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowNormalisedGCN(nn.Module):
    """The reference's two-layer ``GNN``: relu(A (drop(relu(A X W1 + b1)) W2) + b2), A the
    row-normalised operator. The input may come in row blocks (original then generated rows),
    each multiplied by W1 on its own: the mended features are never stacked into one copy."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout_p: float,
                 generator: torch.Generator, dtype: torch.dtype):
        super().__init__()
        self.w1 = _uniform((in_dim, hidden), 1.0 / math.sqrt(hidden), generator, dtype)
        self.b1 = _uniform((hidden,), 1.0 / math.sqrt(hidden), generator, dtype)
        self.w2 = _uniform((hidden, out_dim), 1.0 / math.sqrt(out_dim), generator, dtype)
        self.b2 = _uniform((out_dim,), 1.0 / math.sqrt(out_dim), generator, dtype)
        self.dropout_p = dropout_p

    def forward(self, blocks: list[torch.Tensor], operator: SparseOperator,
                rng: torch.Generator | None) -> torch.Tensor:
        first = torch.cat([block @ self.w1 for block in blocks])
        hidden = torch.relu(operator @ first + self.b1)
        if self.training and rng is not None:
            hidden = dropout(hidden, self.dropout_p, rng)
        return torch.relu(operator @ (hidden @ self.w2) + self.b2)


# A chunk's generated rows at most: K F decides how many rows that is, so wide bag-of-words
# features get short chunks instead of one as large as all a client's rows.
CHUNK_BYTES = 64 * 2 ** 20


class FeatureGenerator(nn.Module):
    """fGen: z + N(0, 1) -> widths (ReLU each) -> dropout -> K F, tanh; [N, K, F]. In training,
    above one chunk (``chunk_rows`` rows, and at most ``CHUNK_BYTES`` of generated rows) the
    rows are written chunk by chunk into one output and recomputed in the backward pass, so
    neither the 2048-wide layer nor tanh's saved output is held for every node; each chunk's
    dropout comes from its own seed, so the recomputation draws the same mask."""

    def __init__(self, latent: int, widths: tuple[int, ...], num_pred: int, num_features: int,
                 dropout_p: float, generator: torch.Generator, dtype: torch.dtype):
        super().__init__()
        sizes = (latent,) + tuple(widths)
        self.hidden = nn.ModuleList(Linear(sizes[k], sizes[k + 1], generator, dtype)
                                    for k in range(len(widths)))
        self.out = Linear(sizes[-1], num_pred * num_features, generator, dtype)
        self.num_pred, self.num_features, self.dropout_p = num_pred, num_features, dropout_p

    def chunk_size(self, n: int, chunk_rows: int) -> int:
        """Rows per chunk: ``chunk_rows`` and no more than CHUNK_BYTES of output (0: all n)."""
        if chunk_rows <= 0:
            return max(1, n)
        row_bytes = self.out.weight.shape[0] * self.out.weight.element_size()
        return max(1, min(chunk_rows, CHUNK_BYTES // row_bytes))

    def _rows(self, h: torch.Tensor, seed: int) -> torch.Tensor:
        for layer in self.hidden:
            h = torch.relu(layer(h))
        if self.training and self.dropout_p > 0:
            h = dropout(h, self.dropout_p, torch.Generator(device=h.device).manual_seed(seed))
        return torch.tanh(self.out(h))

    def forward(self, z: torch.Tensor, rng: torch.Generator, chunk_rows: int = 0) -> torch.Tensor:
        noise = torch.randn(z.shape, generator=rng, dtype=z.dtype, device=z.device)
        h = z + noise
        n = h.shape[0]
        step = self.chunk_size(n, chunk_rows)
        seeds = tuple(int(torch.randint(0, 2 ** 62, (1,), generator=rng, device=rng.device))
                      for _ in range(0, n, step))
        if self.training and torch.is_grad_enabled() and n > step:
            flat = _Recomputed.apply(self, step, seeds, h, *self.parameters())
        elif n <= step:
            flat = (self._rows(h, seeds[0]) if n else
                    h.new_zeros((0, self.out.weight.shape[0])))
        else:
            flat = torch.cat([self._rows(h[k * step:(k + 1) * step], seed)
                              for k, seed in enumerate(seeds)])
        return flat.view(n, self.num_pred, self.num_features)


class _Recomputed(torch.autograd.Function):
    """fGen's rows, chunk by chunk into one output, no activation kept: the backward pass
    recomputes each chunk (same seed, same dropout) and back-propagates it at once, the
    parameters' gradients accumulating into their ``.grad`` as in torch.utils.checkpoint's
    reentrant form (whose first call loads torch's compiler stack, which costs a process far
    more than this). The parameters are inputs only so that the output requires a gradient; as
    with that form, their gradients reach ``.grad`` (``backward()``), not torch.autograd.grad."""

    @staticmethod
    def forward(ctx, generator: "FeatureGenerator", step: int, seeds: tuple[int, ...],
                rows: torch.Tensor, *parameters: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.generator, ctx.step, ctx.seeds = generator, step, seeds
        ctx.save_for_backward(rows)
        out = rows.new_empty((rows.shape[0], generator.out.weight.shape[0]))
        with torch.no_grad():
            for k, seed in enumerate(seeds):
                out[k * step:(k + 1) * step] = generator._rows(rows[k * step:(k + 1) * step], seed)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (rows,) = ctx.saved_tensors
        step = ctx.step
        row_grad = torch.zeros_like(rows) if ctx.needs_input_grad[3] else None
        for k, seed in enumerate(ctx.seeds):
            part = slice(k * step, (k + 1) * step)
            with torch.enable_grad():
                leaf = rows[part].detach().requires_grad_(row_grad is not None)
                out = ctx.generator._rows(leaf, seed)
                # a scalar's gradient: explicit output gradients load sympy on first use
                (out * grad[part]).sum().backward()
            if row_grad is not None:
                row_grad[part] = leaf.grad
        return (None, None, None, row_grad) + (None,) * (len(ctx.needs_input_grad) - 4)


@dataclass(frozen=True)
class NeighGenShape:
    """NeighGen's sizes (the reference's config: hidden 32, latent 128, fGen 256, 2048, K = 5,
    dropout 0.5)."""

    num_features: int
    num_classes: int
    hidden: int
    latent: int
    generator_widths: tuple[int, ...]
    num_pred: int
    dropout: float


class NeighGen(nn.Module):
    """Encoder, dGen, fGen and the classifier on the mended impaired graph (``LocalSage_Plus``)."""

    def __init__(self, shape: NeighGenShape, seed: int, dtype: torch.dtype):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.encoder = RowNormalisedGCN(shape.num_features, shape.hidden, shape.latent,
                                        shape.dropout, generator, dtype)
        self.count = Linear(shape.latent, 1, generator, dtype)  # dGen
        self.features = FeatureGenerator(shape.latent, shape.generator_widths, shape.num_pred,
                                         shape.num_features, shape.dropout, generator, dtype)
        self.classifier = RowNormalisedGCN(shape.num_features, shape.hidden, shape.num_classes,
                                           shape.dropout, generator, dtype)

    def encode(self, x: torch.Tensor, operator: SparseOperator,
               rng: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(z [N, latent], n^ [N])."""
        z = self.encoder([x], operator, rng)
        return z, torch.relu(self.count(z)).squeeze(1)

    def classify(self, x: torch.Tensor, generated: torch.Tensor, mended: SparseOperator,
                 rng: torch.Generator | None) -> torch.Tensor:
        """Class scores [N, C] of the impaired graph's nodes on the mended graph."""
        n = x.shape[0]
        scores = self.classifier([x, generated.reshape(-1, generated.shape[2])], mended, rng)
        return scores[:n]


def mended_operator(adjacency: sp.csr_matrix, slots: torch.Tensor, num_pred: int,
                    dtype: torch.dtype, device: torch.device) -> SparseOperator:
    """The classifier's D^-1 (A + I) on the mended impaired graph."""
    matrix = row_normalised(mended_adjacency(adjacency, slots.cpu().numpy(), num_pred))
    return SparseOperator(matrix, dtype, device)


# -- what a client answers for another client's generated rows -----------------------------------


def draw_targets(adjacency: sp.csr_matrix, x: torch.Tensor, count: int, num_pred: int,
                 rng: np.random.Generator) -> torch.Tensor | None:
    """Features [count, K, F] of K neighbours (uniform, with replacement) of each of ``count``
    nodes drawn uniformly among those with a neighbour (the reference draws any node and draws
    again while it has none: the same distribution). None when no node has a neighbour."""
    degree = np.diff(adjacency.indptr)
    pool = np.flatnonzero(degree > 0)
    if pool.shape[0] == 0:
        return None
    centres = rng.choice(pool, size=count)
    picks = np.floor(rng.random((count, num_pred)) * degree[centres][:, None]).astype(np.int64)
    neighbours = adjacency.indices[adjacency.indptr[centres][:, None] + picks]
    return x[torch.from_numpy(neighbours.reshape(-1)).to(x.device)].view(count, num_pred,
                                                                        x.shape[1])


def answer_rows(rows: torch.Tensor, groups: np.ndarray, adjacency: sp.csr_matrix,
                x: torch.Tensor, num_pred: int, rng: np.random.Generator) -> torch.Tensor:
    """Another client's generated rows [R, F] (node-major slot rows of G nodes; ``groups`` [G, 2]
    = each node's (slots, min(K, n_v))), against this client's own features: per node K
    neighbours of a random node of its own (``draw_targets``). Returns [R, F + 1]: the gradient
    of the summed least MSEs with respect to each row, and each row's least MSE."""
    result = rows.new_zeros((rows.shape[0], rows.shape[1] + 1))
    if rows.shape[0] == 0:
        return result
    targets = draw_targets(adjacency, x, groups.shape[0], num_pred, rng)
    if targets is None:
        return result
    slots = torch.from_numpy(groups[:, 0].copy()).to(x.device)
    true_count = torch.from_numpy(groups[:, 1].copy()).to(x.device)
    node, slot = slot_rows(groups[:, 0])
    leaf = rows.to(x.device, x.dtype).detach().requires_grad_(True)
    padded = leaf.new_zeros((groups.shape[0], num_pred, rows.shape[1]))
    padded = padded.index_put((torch.from_numpy(node).to(x.device),
                               torch.from_numpy(slot).to(x.device)), leaf)
    losses = greedy_slot_losses(padded, targets, slots, true_count)
    (gradient,) = torch.autograd.grad(losses.sum(), leaf)
    result[:, :-1] = gradient.to(result.dtype)
    result[:, -1] = losses.detach()[torch.from_numpy(node).to(x.device),
                                    torch.from_numpy(slot).to(x.device)].to(result.dtype)
    return result
