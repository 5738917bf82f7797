"""Calibrate a synthetic proxy (data_prep/proxies.py): how much its features and its graph each
tell, measured as a real benchmark would, with a feature-only MLP and a full-batch GCN.

    . .venv/bin/activate
    python benchmarks/calibrate_proxy.py --proxy products --scale 0.025
        [--set feature_signal=0.3,label_noise=0.2] [--models mlp,gcn] [--epochs 200]
        [--lr 0.01] [--layers 0] [--seeds 0] [--eval-every 5]

One process, plain torch (no MPI, no shards): the graph is generated in memory with the proxy's
parameters (``--set`` overrides some), then each model trains full batch with the paper's
hyper-parameters (hidden 128, dropout 0.2, Adam, ``--layers`` 0: the paper's depth for the
graph). Printed per model and seed: test micro-F1 at the best validation epoch, that epoch, the
last epoch's test F1, seconds per epoch; then the graph's measured properties (degree, the edge
homophily of the observed labels, class shares). The GCN here is the centralized model of
``python -m mpifgl.train --algo centralized`` written densely for speed; that command confirms
the calibration on shards (docs/paper_scale.md). Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.paper_runs import parse_overrides  # noqa: E402
from data_prep.proxies import PROXIES, proxy  # noqa: E402
from data_prep.synthetic import generate_synthetic  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402


@dataclass(frozen=True)
class CalibrateArgs:
    proxy: str = option("products", "which proxy", tuple(PROXIES))
    scale: float = option(0.025, "fraction of the real graph's nodes and edges")
    set: tuple[str, ...] = option((), "generator overrides FIELD=VALUE, comma-separated "
                                      "(fields of data_prep.config.SyntheticConfig)")
    models: tuple[str, ...] = option(("mlp", "gcn"), "models to train", ("mlp", "gcn"))
    epochs: int = option(200, "full-batch epochs per model")
    lr: float = option(0.01, "Adam learning rate")
    layers: int = option(0, "layers of both models; 0: the paper's depth for this graph")
    seeds: tuple[int, ...] = option((0,), "seeds of the graph and the weights")
    eval_every: int = option(5, "evaluate every this many epochs")
    json_out: Path | None = option(None, "append one JSON line per model and seed here")


def normalized_adjacency(adjacency: sp.csr_matrix) -> sp.csr_matrix:
    """D~^-1/2 (A + I) D~^-1/2 (float32, symmetric)."""
    a = adjacency.astype(np.float32) + sp.identity(adjacency.shape[0], dtype=np.float32,
                                                   format="csr")
    scale = 1.0 / np.sqrt(np.asarray(a.sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(scale) @ a @ sp.diags(scale), dtype=np.float32)


class Operator(NamedTuple):
    """A constant propagation matrix and its transpose (the backward's), both CSR: scipy's
    product with a transposed CSR view (CSC) runs several times slower."""
    matrix: sp.csr_matrix
    transpose: sp.csr_matrix

    @classmethod
    def symmetric(cls, matrix: sp.csr_matrix) -> "Operator":
        return cls(matrix, matrix)

    def __matmul__(self, dense: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ dense)


class Propagate(torch.autograd.Function):
    """operator @ h for a constant operator (scipy's kernel: faster than torch's sparse product
    on CPU); the backward multiplies by the operator's transpose."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, operator: Operator):  # type: ignore[override]
        ctx.transpose = operator.transpose
        return torch.from_numpy(operator @ h.detach().numpy())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return torch.from_numpy(np.asarray(ctx.transpose @ grad.contiguous().numpy())), None


class Net(nn.Module):
    """An MLP (no operator), a GCN or GraphSAGE-mean as mpifgl's layers: dropout -> z W^T ->
    (propagate) -> + b (+ z W_r^T for sage), ReLU between. ``propagation`` is the whole graph's
    operator (the forward's); ``preactivations`` takes any other (a sample's)."""

    def __init__(self, dims: list[int], dropout: float, propagation: Operator | None,
                 backbone: str = "gcn"):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.roots = nn.ModuleList(nn.Linear(a, b, bias=False)
                                   for a, b in zip(dims[:-1], dims[1:])) if backbone == "sage" \
            else None
        self.dropout, self.propagation = dropout, propagation

    def own(self, layer: int, z: torch.Tensor) -> torch.Tensor | float:
        """The node's own row's term, apart from the propagated sum (sage only)."""
        return 0.0 if self.roots is None else z @ self.roots[layer].weight.T

    def preactivations(self, x: torch.Tensor, operator: Operator | None) -> list[torch.Tensor]:
        """Every layer's pre-activation under ``operator`` (None: an MLP)."""
        z, outputs = x, []
        for layer, lin in enumerate(self.lins):
            z = F.dropout(z, self.dropout, self.training)
            if operator is None:
                h = lin(z)
            else:
                h = Propagate.apply(z @ lin.weight.T, operator) + lin.bias + self.own(layer, z)
            outputs.append(h)
            z = F.relu(h)
        return outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.preactivations(x, self.propagation)[-1]


def train(model: Net, x: torch.Tensor, y: torch.Tensor, masks: dict[str, torch.Tensor],
          epochs: int, lr: float, eval_every: int) -> dict:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    best = {"val": -1.0, "test": 0.0, "epoch": 0}
    curve = []
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        model.train()
        optimizer.zero_grad()
        if model.propagation is None:  # an MLP needs only the training rows
            loss = F.cross_entropy(model(x[masks["train"]]), y[masks["train"]])
        else:
            loss = F.cross_entropy(model(x)[masks["train"]], y[masks["train"]])
        loss.backward()
        optimizer.step()
        if epoch % eval_every and epoch != epochs:
            continue
        model.eval()
        with torch.no_grad():
            predicted = model(x).argmax(1)
        scores = {s: float((predicted[m] == y[m]).float().mean()) for s, m in masks.items()}
        curve.append((epoch, float(loss.detach()), scores["train"], scores["val"], scores["test"]))
        if scores["val"] > best["val"]:
            best = {"val": scores["val"], "test": scores["test"], "epoch": epoch}
    seconds = (time.perf_counter() - start) / epochs
    return {"best_val": best["val"], "test": best["test"], "best_epoch": best["epoch"],
            "last_test": curve[-1][4], "last_loss": curve[-1][1], "seconds_per_epoch": seconds,
            "curve": curve}


def describe(graph) -> str:
    degree = np.diff(graph.adjacency.indptr)
    coo = graph.adjacency.tocoo()
    homophily = float(np.mean(graph.y[coo.row] == graph.y[coo.col]))
    shares = np.bincount(graph.y) / graph.y.shape[0]
    return (f"{graph.num_nodes:,} nodes, {graph.num_edges:,} edges, degree mean "
            f"{degree.mean():.1f} median {np.median(degree):.0f} max {degree.max():,}; observed "
            f"edge homophily {homophily:.3f}; class shares {shares.max():.3f}..{shares.min():.4f}"
            f"; split {graph.split_rule} ({graph.train_mask.sum():,} / {graph.val_mask.sum():,} "
            f"/ {graph.test_mask.sum():,})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, CalibrateArgs)
    args = dataclass_from_namespace(CalibrateArgs, parser.parse_args())
    spec = proxy(args.proxy)
    overrides = parse_overrides(args.set)
    layers = args.layers or spec.layers
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for seed in args.seeds:
        config = replace(spec.config(args.scale, seed), **overrides)
        start = time.perf_counter()
        graph = generate_synthetic(config, split_seed=seed)
        print(f"{args.proxy} x{args.scale:g} seed {seed} ({time.perf_counter() - start:.1f} s): "
              f"{describe(graph)}", flush=True)
        print(f"  knobs: {json.dumps({k: v for k, v in config.as_dict().items() if k not in ('nodes', 'edges', 'avg_degree', 'seed')})}",
              flush=True)
        x = torch.from_numpy(graph.x)
        y = torch.from_numpy(graph.y)
        masks = {"train": torch.from_numpy(graph.train_mask),
                 "val": torch.from_numpy(graph.val_mask), "test": torch.from_numpy(graph.test_mask)}
        dims = [graph.num_features] + [128] * (layers - 1) + [graph.num_classes]
        propagation = Operator.symmetric(normalized_adjacency(graph.adjacency)) \
            if "gcn" in args.models else None
        for name in args.models:
            torch.manual_seed(seed)
            model = Net(dims, 0.2, propagation if name == "gcn" else None)
            result = train(model, x, y, masks, args.epochs, args.lr, args.eval_every)
            target = spec.targets.get(name)
            print(f"  {name:4} {layers} layers lr {args.lr:g}: test {100 * result['test']:.2f} "
                  f"(val {100 * result['best_val']:.2f}, epoch {result['best_epoch']}; last "
                  f"{100 * result['last_test']:.2f}, loss {result['last_loss']:.3f}) target "
                  f"{target if target is not None else 'n/a'}; {result['seconds_per_epoch']:.2f}"
                  f" s/epoch", flush=True)
            if args.json_out is not None:
                record = {"proxy": args.proxy, "scale": args.scale, "seed": seed, "model": name,
                          "layers": layers, "lr": args.lr, "epochs": args.epochs,
                          "overrides": overrides, **result}
                with open(args.json_out, "a") as handle:
                    handle.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
