"""CAGNET (Tripathy, Yelick, Buluc, SC 2020): exact full-batch GCN training over the P = m client
ranks, with its 1.5D algorithm (``--replication c``; c = 1 is its 1D algorithm), scheduled as the
reference code schedules it (PASSIONLab/CAGNET: gcn_distr_15d.py, gcn_distr.py).

Layout. Nodes are numbered client-major (client k's nodes are ``offsets[k]..offsets[k+1]``). The
P clients form P/c block rows of c consecutive clients: client k is replica j = k % c of block
row b = k // c, whose rows are its c clients' nodes. The blocks are cut at client boundaries,
not into equal pieces: with c = 1 a client then holds exactly its own shard and nothing moves at
set-up, and the bytes per epoch are those of equal cuts of the same sizes. Row group b: the c
replicas of block row b; column group j: replica j of every block row (P/c ranks, ordered by
block row). Each rank holds its block row's features and labels (c clients' rows) and, of the
normalised adjacency's block row, the blocks it multiplies with.

Set-up (counted before the first epoch, so in no epoch's bytes): the global degrees (every
client's through the server, once); with c > 1 the c clients of a block row broadcast their
shards' rows (features, adjacency rows, labels and masks) within their row group. CAGNET is not
private by design: every client then holds other clients' raw rows (docs/privacy.md).

One layer, Z = Â H W^T + bias with Â = D~^-1/2 (A + I) D~^-1/2 over global degrees (our GCN
layer, ``mpifgl.model.GCNLayer``: its weights, bias and initialisation, so that a run equals
``--algo centralized``):

* forward, the SpMM (Â H)_b: replica j runs the stages of its blocks k in ``stage_blocks``: H_k
  is broadcast within column group j from replica j of block row k, and every rank adds
  Â_{b,k} H_k; an allreduce of these partial sums within row group b gives every replica the
  whole (Â H)_b. Then Z_b = (Â H)_b W^T + bias.
* backward, the same SpMM of the incoming gradient G (Â is symmetric): (Â G)_b; then
  dL/dH_b = (Â G)_b W, and dL/dW = (Â G)_b^T H_b, dL/dbias = the sum of G_b's rows, allreduced
  within column group j (one contribution per block row).

Loss: the sum of cross-entropies over the block row's training nodes divided by the GLOBAL
number of training nodes (the refactor branch's global mean), summed over a column group for
the logged loss. Every rank takes the same Adam step; the server takes no part in the method but
keeps the run's books: client 0 sends it the step's summed gradients and loss (a group of the
two ranks), so its model, which writes model.pt and checkpoints, is the clients' model.

Departures from the reference, all listed in docs/algorithms.md: our GCN layer (a bias, Glorot
initialisation, activations and normalisation on; the reference's timing command runs a linear
model on the raw adjacency, no bias, U[0,1) weights); blocks cut at client boundaries instead of
ceil(n / (P/c)) equal rows; a rank keeps only the adjacency blocks of its stages (the reference
keeps the whole block row, unused); the global mean loss instead of a mean per block; dropout
(the reference has none) as ``--dropout`` on every layer's input, with masks drawn per block row
(the replicas of a block draw the same ones), so with dropout a run is centralized training in
distribution, not mask for mask; the weight gradients of layer 1 are computed as the reference
does, but its input gradient (the features') is not.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mpifgl.communicator import Communicator, allreduce_traffic, broadcast_traffic
from mpifgl.graph import ClientGraph
from mpifgl.model import dropout, flatten, relu_dropout, unflatten
from mpifgl.operators import CSRArrays, SparseMatrix
from mpifgl.tensor_memory import SavedActivations, held_adjacency, tensor_report
from mpifgl.trainer import RankSetup, dropout_stream

MIRROR_ROOT = 1  # client 0's rank in the group of the server and client 0


def stage_blocks(replica: int, replicas: int, blocks: int) -> range:
    """The block columns replica j broadcasts and multiplies with, in stage order: blocks //
    replicas² each, the last replica the rest (gcn_distr_15d.py's ``broad_func``)."""
    per = blocks // replicas  # = P / c^2
    first = replica * per
    return range(first, blocks if replica == replicas - 1 else first + per)


def block_sizes(client_sizes: np.ndarray, replicas: int) -> np.ndarray:
    """Rows of each block row: the sizes of its c consecutive clients added up."""
    return np.asarray(client_sizes, np.int64).reshape(-1, replicas).sum(axis=1)


def step_traffic(client_sizes: np.ndarray, replicas: int, widths: list[int], itemsize: int,
                  ) -> list[tuple[int, int]]:
    """(bytes sent, bytes received) of each client in one training step, as the communicator
    counts them (``broadcast_traffic``, ``allreduce_traffic``): the SpMM of every layer's input
    forward (widths[l]) and of its output's gradient backward (widths[l + 1]), each weight and
    bias gradient allreduce, the loss's allreduce, and client 0's message to the server.
    ``widths``: [features, hidden..., classes]."""
    sizes = block_sizes(client_sizes, replicas)
    blocks = sizes.shape[0]
    spmm_widths = widths[:-1] + widths[1:]
    parameters = sum(widths[l] * widths[l + 1] + widths[l + 1] for l in range(len(widths) - 1))
    traffic = []
    for client in range(len(client_sizes)):
        block, replica = divmod(client, replicas)
        sent = received = 0
        for width in spmm_widths:
            for k in stage_blocks(replica, replicas, blocks):
                s, r = broadcast_traffic(int(sizes[k]) * width * itemsize, blocks, k == block)
                sent, received = sent + s, received + r
            s, r = allreduce_traffic(int(sizes[block]) * width * itemsize, replicas)
            sent, received = sent + s, received + r
        for l in range(len(widths) - 1):
            s, r = allreduce_traffic((widths[l] * widths[l + 1] + widths[l + 1]) * itemsize,
                                     blocks)
            sent, received = sent + s, received + r
        s, r = allreduce_traffic(itemsize, blocks)  # the loss
        sent, received = sent + s, received + r
        if client == 0:  # the step's gradients and loss to the server
            sent += (parameters + 1) * itemsize
        traffic.append((sent, received))
    return traffic


class BlockRowSchedule:
    """One client's side of CAGNET's SpMM: its stages' adjacency blocks, its column and row
    groups, and the buffer each stage's broadcast is received in."""

    def __init__(self, blocks: dict[int, SparseMatrix], sizes: np.ndarray, block: int,
                 columns: Communicator, rows: Communicator, dtype: torch.dtype,
                 device: torch.device, max_width: int):
        self.blocks, self.sizes, self.block = blocks, sizes, block
        self.columns, self.rows = columns, rows
        self.dtype, self.device = dtype, device
        # the reference allocates a receive buffer per stage; one reused of the largest size
        self.receive = torch.empty(int(sizes.max()) * max_width, dtype=dtype)
        self.local_gradients: dict[int, torch.Tensor] = {}  # layer -> its share before the sum

    def spmm(self, h: torch.Tensor) -> torch.Tensor:
        """(Â H)_b from this block row's H_b [n_b, d] (collective over the client ranks)."""
        width = h.shape[1]
        partial = torch.zeros((int(self.sizes[self.block]), width), dtype=self.dtype,
                              device=self.device)
        for k, matrix in self.blocks.items():  # stage order
            if k == self.block:
                received = _host(h)
            else:
                received = self.receive[:int(self.sizes[k]) * width].view(-1, width)
            self.columns.broadcast_buffer(received, root=k)
            partial += matrix.matmul(received.to(self.device))
        if self.rows.size > 1:
            host = _host(partial)
            self.rows.allreduce_sum(host)
            partial = host.to(self.device)
        return partial

    def sum_gradients(self, layer: int, local: torch.Tensor) -> torch.Tensor:
        """The weight and bias gradient summed over the block rows (one allreduce in the
        column group); this rank's own share is kept for the finite check."""
        self.local_gradients[layer] = local.detach().clone()
        host = _host(local)
        self.columns.allreduce_sum(host)
        return host.to(self.device)


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor of ``tensor``'s values (itself where it already is one)."""
    return tensor.detach().to("cpu").contiguous()


class _BlockRowGCNLayer(torch.autograd.Function):
    """Z_b = (Â H)_b W^T + bias, with CAGNET's backward (module docstring)."""

    @staticmethod
    def forward(ctx, h, weight, bias, schedule: BlockRowSchedule,  # type: ignore[override]
                layer: int):
        aggregated = schedule.spmm(h)
        ctx.save_for_backward(h, weight)
        ctx.schedule, ctx.layer = schedule, layer
        return torch.addmm(bias, aggregated, weight.T)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        h, weight = ctx.saved_tensors
        schedule = ctx.schedule
        aggregated = schedule.spmm(grad.contiguous())  # (Â G)_b: Â is symmetric
        grad_input = aggregated @ weight if ctx.needs_input_grad[0] else None
        local = torch.cat([(aggregated.T @ h).reshape(-1), grad.sum(dim=0)])
        summed = schedule.sum_gradients(ctx.layer, local)
        count = weight.numel()
        return (grad_input, summed[:count].view_as(weight), summed[count:], None, None)


class CAGNETMethod:
    """One rank's side of CAGNET (module docstring). Collective set-up over every rank."""

    def __init__(self, setup: RankSetup):
        config, comm, graph = setup.config, setup.comm, setup.graph
        if config.backbone != "gcn" or config.sampling != "none":
            raise ValueError(f"--algo cagnet trains GCN layers on the full graph: expected "
                             f"--backbone gcn and --sampling none, got {config.backbone} and "
                             f"{config.sampling}")
        self.setup, self.comm = setup, comm
        self.config = config if config.steps_per_epoch else config.replace(steps_per_epoch=1)
        self.dtype, self.device = setup.dtype, setup.device
        self.model, self.optimizer = setup.gnn_and_optimizer()
        self.layers = list(self.model.layers)
        self.replicas = config.replication
        self.global_train = setup.global_split_counts["train"]
        moved = comm.bytes_sent + comm.bytes_received
        self.mirror = comm.split(0 if comm.rank <= MIRROR_ROOT else -1, comm.rank)
        degree = global_degrees(comm, graph)
        self.clients = comm.split(0 if comm.is_client else -1, comm.rank)
        self.activations = SavedActivations(self.model.parameters())
        self.schedule: BlockRowSchedule | None = None
        if comm.is_client:
            self._set_up_block_row(graph, degree)
        self.setup_bytes = comm.bytes_sent + comm.bytes_received - moved  # in no epoch's count

    def _set_up_block_row(self, graph: ClientGraph, degree: np.ndarray) -> None:
        config, setup = self.config, self.setup
        block, replica = divmod(graph.client_id, self.replicas)
        rows = self.clients.split(block, replica)  # the replicas of this block row
        columns = self.clients.split(replica, block)  # one rank per block row
        shards = block_row_shards(rows, graph, self.replicas, block)
        sizes = block_sizes(graph.client_sizes, self.replicas)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        adjacency = sp.vstack([s["adjacency"] for s in shards], format="csr")
        normalised = normalised_block_row(adjacency, degree, int(starts[block]))
        blocks = {k: SparseMatrix(CSRArrays.of(normalised[:, starts[k]:starts[k + 1]]),
                                  self.dtype, self.device)
                  for k in stage_blocks(replica, self.replicas, sizes.shape[0])}
        self.schedule = BlockRowSchedule(blocks, sizes, block, columns, rows, self.dtype,
                                         self.device, max(self.model.widths))
        def cat(name: str) -> np.ndarray:  # with c = 1 the shard's own arrays, not a copy
            parts = [s[name] for s in shards]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.x = torch.from_numpy(np.ascontiguousarray(cat("x"))).to(self.dtype).to(self.device)
        self.y = torch.from_numpy(cat("y")).to(self.device)
        self.train_mask = torch.from_numpy(cat("train")).to(self.device)
        own_start = int(graph.offsets[graph.client_id] - starts[block])
        self.own_rows = slice(own_start, own_start + graph.num_nodes)
        # the replicas of a block row draw the same dropout masks (module docstring)
        seed = np.random.SeedSequence([config.seed, block, self.replicas]).generate_state(1)[0]
        setup.dropout_rng = dropout_stream(int(seed), self.device)
        self.activations = SavedActivations([*self.model.parameters(), self.x])

    # -- one step -------------------------------------------------------------------------------
    def forward(self, training: bool) -> torch.Tensor:
        """This block row's logits [n_b, C] (collective over the client ranks)."""
        rng = self.setup.dropout_rng if training else None
        h = self.x if rng is None else dropout(self.x, self.config.dropout, rng)
        for index, layer in enumerate(self.layers):
            h = _BlockRowGCNLayer.apply(h, layer.lin.weight, layer.bias, self.schedule, index)
            if index < len(self.layers) - 1:  # and the next layer's dropout, as every GNN here
                h = relu_dropout(h, self.config.dropout, rng)
        return h

    def loss_and_gradients(self) -> float:
        """Forward, loss, backward: leaves the global gradient in every parameter's .grad on
        every client and returns the global loss (clients only)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        with self.activations.measure():
            logits = self.forward(training=True)
            train = self.train_mask
            loss = F.cross_entropy(logits[train], self.y[train], reduction="sum")
            loss = loss / max(1, self.global_train)
        loss.backward()  # per layer: the SpMM of the gradient, the weight gradients' allreduce
        local = float(loss.detach())
        shares = [self.schedule.local_gradients[k] for k in range(len(self.layers))]
        self.setup.finite.before_sum(local, flatten(shares).cpu().numpy(), self.model,
                                     "local gradient")
        total = torch.tensor([local], dtype=self.dtype)
        self.schedule.columns.allreduce_sum(total)
        return float(total[0])

    def train_step(self) -> float:
        parameters = list(self.model.parameters())
        message = torch.empty(sum(p.numel() for p in parameters) + 1, dtype=self.dtype)
        if self.comm.is_client:
            loss = self.loss_and_gradients()
            if self.mirror is not None:  # client 0: the step's gradients to the server
                message = flatten([p.grad for p in parameters]
                                  + [torch.tensor([loss], dtype=self.dtype)]).cpu()
                self.mirror.broadcast_buffer(message, root=MIRROR_ROOT)
        else:  # the server: the same step from client 0's gradients
            self.mirror.broadcast_buffer(message, root=MIRROR_ROOT)
            for p, grad in zip(parameters, unflatten(message[:-1].to(self.device), parameters)):
                p.grad = grad
            loss = float(message[-1])
        self.optimizer.step()
        return loss

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        """This client's own nodes' logits (the block row's forward); [0, C] on the server."""
        if not self.comm.is_client:
            return torch.zeros((0, self.setup.num_classes), dtype=self.dtype, device=self.device)
        self.model.eval()
        return self.forward(training=False)[self.own_rows]

    # -- checkpoints: the dropout stream (saved by the Trainer) is all of a rank's own state ----
    def rank_state(self) -> dict[str, Any]:
        return {}

    def restore_rank_state(self, state: dict[str, Any]) -> None:
        pass

    # -- what the run reports -------------------------------------------------------------------
    def rank_report(self) -> dict[str, Any]:
        """This rank's tensors by kind (``mpifgl.tensor_memory.tensor_report``: its block row's
        features and its stages' adjacency blocks beside the shard it loaded; the server holds
        its copy of the model only) and the bytes its set-up moved."""
        graph, schedule = self.setup.graph, self.schedule
        blocks = list(schedule.blocks.values()) if schedule is not None else []
        partial_sums = 0 if schedule is None else \
            int(schedule.sizes[schedule.block]) * max(self.model.widths) * self.dtype.itemsize
        memory = tensor_report([graph.x, getattr(self, "x", None)],
                               [held_adjacency(graph), blocks], self.activations.peak,
                               None if schedule is None else schedule.receive, self.model,
                               self.optimizer, more_buffer_bytes=partial_sums)
        return {"tensor_bytes": memory, "setup_bytes": self.setup_bytes}


def global_degrees(comm: Communicator, graph: ClientGraph) -> np.ndarray:
    """Every node's whole-graph degree, client-ordered, on every rank: each client's through
    the server (set-up; the server's entry is empty)."""
    counts = np.concatenate([[0], graph.client_sizes]).astype(np.int64)
    gathered = comm.gatherv(torch.from_numpy(np.asarray(graph.degree, np.int64)),
                            counts if comm.is_server else None)
    return comm.broadcast_array(gathered).numpy()


def own_rows(graph: ClientGraph) -> sp.csr_matrix:
    """This client's rows of the adjacency [n_i, n], client-ordered columns (A_ii and A_ij)."""
    start = int(graph.offsets[graph.client_id])
    inner = graph.inner.tocoo()
    shifted = sp.csr_matrix((inner.data, (inner.row, inner.col + start)), shape=graph.cross.shape)
    return (graph.cross + shifted).tocsr()


def block_row_shards(rows: Communicator, graph: ClientGraph, replicas: int,
                     block: int) -> list[dict[str, np.ndarray]]:
    """The rows of the c clients of this block row, in client order: this client's own, the
    others' broadcast by each within the row group (collective over it)."""
    mine = own_rows(graph)
    labels = np.stack([graph.y, graph.train_mask, graph.val_mask, graph.test_mask], axis=1)
    shards = []
    for replica in range(replicas):
        client = block * replicas + replica
        n = int(graph.client_sizes[client])
        is_root = client == graph.client_id
        entries = torch.tensor([mine.nnz if is_root else 0], dtype=torch.int64)
        rows.broadcast_buffer(entries, root=replica)
        nnz = int(entries[0])

        def share(array: np.ndarray | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            values = np.ascontiguousarray(array, dtype=dtype) if is_root else \
                np.empty(shape, dtype=dtype)
            return rows.broadcast_buffer(torch.from_numpy(values), root=replica).numpy()

        width = graph.x.shape[1]
        x = share(graph.x if is_root else None, (n, width), graph.x.dtype)
        indptr = share(mine.indptr if is_root else None, (n + 1,), np.int64)
        indices = share(mine.indices if is_root else None, (nnz,), np.int64)
        data = share(mine.data if is_root else None, (nnz,), np.float32)
        table = share(labels if is_root else None, (n, 4), np.int64)
        shards.append({"x": x, "y": table[:, 0].copy(), "train": table[:, 1].astype(bool),
                       "adjacency": sp.csr_matrix((data, indices, indptr),
                                                  shape=(n, graph.cross.shape[1]))})
    return shards


def normalised_block_row(adjacency: sp.csr_matrix, degree: np.ndarray,
                         start: int) -> sp.csr_matrix:
    """D~^-1/2 (A + I) D~^-1/2 for the rows ``start..start + n_b`` of A (``adjacency``
    [n_b, n]), d~ = whole-graph degree + 1, in float64 (the layer's dtype is taken later)."""
    inverse_root = 1.0 / np.sqrt(np.asarray(degree, np.float64) + 1.0)
    coo = adjacency.tocoo()
    n_b = adjacency.shape[0]
    local = np.arange(n_b)
    row = np.concatenate([coo.row, local])
    col = np.concatenate([coo.col, start + local])
    value = np.concatenate([coo.data.astype(np.float64), np.ones(n_b)])
    value *= inverse_root[start + row] * inverse_root[col]
    return sp.csr_matrix((value, (row, col)), shape=adjacency.shape)


def build_cagnet(setup: RankSetup) -> CAGNETMethod:
    return CAGNETMethod(setup)
