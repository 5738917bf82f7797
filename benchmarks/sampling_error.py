"""Where node sampling loses accuracy, and what would not: the eq. 4 estimator against exact
aggregation, layer by layer, and training with it against alternatives, on a proxy graph.

    . .venv/bin/activate
    python benchmarks/sampling_error.py --proxy products --scale 0.025
        [--set feature_signal=0.05] [--fractions 0.05,0.1,0.2,0.4] [--layers 0]
        [--estimators eq4,no-norm,exact-first,history] [--warmup-epochs 50] [--draws 20]
        [--train-epochs 100] [--fraction 0] [--lr 0.01] [--seed 0] [--backbone gcn|sage]
        [--json-out FILE]

One process, plain torch and scipy, no MPI: the whole graph is one client. With a random
partition ours draws about uniformly (Q_i is close to 1 / n_i), so the sample here is s uniform
draws with replacement, p(u) = 1 - (1 - 1/n)^s, and eq. 4 divides every neighbour's message by
p(u) but not the node's own self-loop term (mpifgl/sampling.py). ``--backbone`` picks the layer
as mpifgl's does: gcn, P Z W + b with P = D~^-1/2 (A + I) D~^-1/2 (the node's own row one
term of the sampled sum); sage, GraphSAGE-mean, M Z W_l + b + Z W_r with M = D^-1 A (the
neighbours' mean sampled, the own row exact with its own weight). The estimators:

  eq4          the paper's (``--sampling label``): every layer aggregates over the sampled
               nodes only, neighbours scaled by 1/p
  no-norm      the same without 1/p (ours*, ``--no-normalize``)
  exact-first  layer 1 exact: (P X) computed once (features are constant), so the first layer
               of a sampled node sees all its neighbours; eq. 4 above it
  history      exact first layer and, above it, control variates from historical activations
               (VR-GCN, Chen et al. 2018): H_S = P_S (Z_S - Zbar_S) W / p + (P Zbar)_S W, with
               Zbar the full-graph activations refreshed once per epoch

Part 1, the error at fixed weights: a full-batch model trains ``--warmup-epochs`` epochs; at its
weights (dropout off) each estimator draws ``--draws`` samples per fraction s / n, and prints the
relative error ||H_S - H||_F / ||H||_F of every layer's pre-activations on the sampled rows, the
training loss on the sampled training nodes minus the exact loss on the same nodes (the loss of
an unbiased H is not unbiased: E[loss(H_S)] != loss(H)), and the weight gradient's relative
error, mean over draws of ||g_S - g|| / ||g||, and its bias, ||mean over draws of (g_S - g)|| /
mean ||g|| (with a noise floor of about error / sqrt(draws)), g the gradient of the exact loss on
the same nodes, and how often the sampled logits' class is the exact logits' on the sample's
training nodes (agree). For history the activations of one epoch earlier stand in for the
stale Zbar.

Part 2 (``--train-epochs`` > 0), training: each estimator trains with ``--fraction`` s / n (0:
the paper's) and steps per epoch ceil(n / s), and a full-batch model beside them; printed: test
micro-F1 at the best validation epoch (evaluation every 5 epochs), the lowest training loss,
seconds per epoch. Same model as mpifgl (hidden 128, dropout 0.2, Adam, loss summed over the
sample's training nodes over their count). Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.calibrate_proxy import (  # noqa: E402
    Net, Operator, Propagate, describe, parse_overrides)
from data_prep.proxies import PROXIES, proxy  # noqa: E402
from data_prep.synthetic import generate_synthetic  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402

ESTIMATORS = ("eq4", "no-norm", "exact-first", "history")
BACKBONES = ("gcn", "sage")


@dataclass(frozen=True)
class ErrorArgs:
    proxy: str = option("products", "which proxy", tuple(PROXIES))
    scale: float = option(0.025, "fraction of the real graph's nodes and edges")
    set: tuple[str, ...] = option((), "generator overrides FIELD=VALUE, comma-separated")
    fractions: tuple[float, ...] = option((0.05, 0.1, 0.2, 0.4, 0.7), "s / n of part 1")
    layers: int = option(0, "layers; 0: the paper's depth for the proxy")
    estimators: tuple[str, ...] = option(ESTIMATORS, "estimators", ESTIMATORS)
    warmup_epochs: int = option(50, "full-batch epochs before part 1 measures")
    draws: int = option(20, "samples per estimator and fraction in part 1")
    train_epochs: int = option(0, "part 2: epochs of training per estimator (0: skip)")
    fraction: float = option(0.0, "part 2: s / n; 0: the paper's (500,000 / 2,449,029 on "
                                  "products, 50,000 / 232,965 on Reddit)")
    lr: float = option(0.01, "Adam learning rate")
    seed: int = option(0, "seed of the graph, the weights and the samples")
    backbone: str = option("gcn", "layers: gcn (the node's own row inside the sampled sum) or "
                                  "sage (GraphSAGE-mean: the own row exact, weighted apart)",
                           BACKBONES)
    json_out: Path | None = option(None, "append the results here as JSON lines")


class Graph:
    """The whole graph's propagation of one backbone and its sampled form (eq. 4)."""

    def __init__(self, adjacency: sp.csr_matrix, backbone: str):
        self.n, self.backbone = adjacency.shape[0], backbone
        self.adjacency = adjacency.astype(np.float32).tocsr()
        degree = np.asarray(self.adjacency.sum(axis=1)).ravel()
        if backbone == "gcn":  # D~^-1/2 A D~^-1/2 plus the self loops 1 / (d + 1)
            self.row_scale = self.col_scale = (1.0 / np.sqrt(degree + 1.0)).astype(np.float32)
            self.self_weight = (1.0 / (degree + 1.0)).astype(np.float32)
        else:  # the neighbours' mean D^-1 A; no self term (SAGE's own row has its own weight)
            self.row_scale = np.where(degree > 0, 1.0 / np.maximum(degree, 1.0), 0.0
                                      ).astype(np.float32)
            self.col_scale = np.ones(self.n, dtype=np.float32)
            self.self_weight = np.zeros(self.n, dtype=np.float32)
        self.full = self.sampled(np.arange(self.n), 1.0)

    def sampled(self, rows: np.ndarray, p: float) -> Operator:
        """eq. 4's operator on the sample: neighbours scaled by 1/p, the self term not (every
        node at p = 1: the whole graph's)."""
        block = self.adjacency[rows][:, rows]
        matrix = sp.csr_matrix(sp.diags(self.row_scale[rows]) @ block
                               @ sp.diags(self.col_scale[rows] / p)
                               + sp.diags(self.self_weight[rows]), dtype=np.float32)
        # GCN's operator is symmetric (a scalar 1/p keeps it so); the neighbours' mean is not
        return Operator.symmetric(matrix) if self.backbone == "gcn" else \
            Operator(matrix, matrix.T.tocsr())


def draw(n: int, s: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """s uniform draws with replacement: the distinct nodes and their inclusion probability."""
    rows = np.unique(rng.integers(0, n, s))
    return rows, -math.expm1(s * math.log1p(-1.0 / n))


class Sampler:
    """One estimator's forward on a sample (pre-activations of every layer)."""

    def __init__(self, name: str, graph: Graph, x: torch.Tensor, model: Net):
        self.name, self.graph, self.x, self.model = name, graph, x, model
        self.px = torch.from_numpy(graph.full @ x.numpy()) if name in (
            "exact-first", "history") else None
        self.history: list[torch.Tensor] = []  # Zbar^l, l = 1..L-1 [n, 128]
        self.p_history: list[torch.Tensor] = []  # P Zbar^l

    @torch.no_grad()
    def refresh(self, model: Net | None = None) -> None:
        """history: the full-graph activations of ``model`` (default: the current one)."""
        if self.name != "history":
            return
        model = model or self.model
        was_training = model.training
        model.eval()
        self.history = [F.relu(h) for h in model.preactivations(self.x, self.graph.full)[:-1]]
        self.p_history = [torch.from_numpy(self.graph.full @ z.numpy())
                          for z in self.history]
        model.train(was_training)

    def forward(self, rows: np.ndarray, p: float) -> list[torch.Tensor]:
        model, dropout = self.model, self.model.dropout if self.model.training else 0.0
        operator = self.graph.sampled(rows, 1.0 if self.name == "no-norm" else p)
        index = torch.from_numpy(rows)
        z = self.x[index]
        outputs = []
        for layer, lin in enumerate(model.lins):
            if layer == 0 and self.px is not None:
                h = F.dropout(self.px[index], dropout, model.training) @ lin.weight.T + lin.bias
                if model.roots is not None:  # SAGE's own row: the input itself
                    h = h + model.own(layer, F.dropout(z, dropout, model.training))
            else:
                dropped = F.dropout(z, dropout, model.training)
                if self.name == "history":
                    stale = self.history[layer - 1][index] @ lin.weight.T
                    h = (Propagate.apply(dropped @ lin.weight.T - stale, operator)
                         + self.p_history[layer - 1][index] @ lin.weight.T + lin.bias)
                else:
                    h = Propagate.apply(dropped @ lin.weight.T, operator) + lin.bias
                h = h + model.own(layer, dropped)
            outputs.append(h)
            z = F.relu(h)
        return outputs


def sampled_loss(logits: torch.Tensor, y: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[train], y[train], reduction="sum") / max(1, int(train.sum()))


def gradient(model: Net, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=retain_graph)
    return torch.cat([g.reshape(-1) for g in grads])


def measure(args: ErrorArgs, graph: Graph, x, y, train_mask, model: Net,
            previous: Net) -> list:
    """Part 1: each estimator's error at the model's weights."""
    model.eval()
    # one exact forward, its graph kept: every draw's exact loss is a slice of its logits
    exact = model.preactivations(x, graph.full)
    exact_grad_cache = {}
    results = []
    for fraction in args.fractions:
        s = max(1, round(fraction * graph.n))
        for name in args.estimators:
            sampler = Sampler(name, graph, x, model)
            sampler.refresh(previous)  # the activations one epoch earlier: stale history
            errors = np.zeros((args.draws, len(model.lins)))
            loss_gap, grad_errors, grads, exact_grads, agree = [], [], [], [], []
            for d in range(args.draws):
                rows, p = draw(graph.n, s, np.random.default_rng([args.seed, 2, d,
                                                                  round(fraction * 1e6)]))
                index = torch.from_numpy(rows)
                outputs = sampler.forward(rows, p)
                for layer, h in enumerate(outputs):
                    reference = exact[layer][index].detach()
                    errors[d, layer] = float(torch.linalg.norm(h.detach() - reference)
                                             / torch.linalg.norm(reference))
                train = train_mask[index]
                loss = sampled_loss(outputs[-1], y[index], train)
                key = (fraction, d)
                if key not in exact_grad_cache:
                    exact_loss = sampled_loss(exact[-1][index], y[index], train)
                    exact_grad_cache[key] = (exact_loss.item(),
                                             gradient(model, exact_loss, retain_graph=True))
                exact_value, exact_grad = exact_grad_cache[key]
                agree.append(float((outputs[-1][train].argmax(1)
                                    == exact[-1].detach()[index][train].argmax(1)).float().mean()))
                g = gradient(model, loss)
                loss_gap.append(loss.item() - exact_value)
                grad_errors.append(float(torch.linalg.norm(g - exact_grad)
                                         / torch.linalg.norm(exact_grad)))
                grads.append(g)
                exact_grads.append(exact_grad)
            # the mean difference over draws, against the mean size of the exact gradient
            difference = (torch.stack(grads) - torch.stack(exact_grads)).mean(0)
            size = float(torch.stack([torch.linalg.norm(g) for g in exact_grads]).mean())
            bias = float(torch.linalg.norm(difference)) / size
            result = {"fraction": fraction, "estimator": name,
                      "layer_error": errors.mean(0).round(4).tolist(),
                      "loss_gap": float(np.mean(loss_gap)),
                      "loss_gap_std": float(np.std(loss_gap)),
                      "grad_error": float(np.mean(grad_errors)), "grad_bias": bias,
                      "agree": float(np.mean(agree))}
            results.append(result)
            print(f"  s/n {fraction:<5g} {name:12} layer error "
                  f"{' '.join(f'{e:.3f}' for e in result['layer_error'])}  loss - exact "
                  f"{result['loss_gap']:+.3f} (sd {result['loss_gap_std']:.3f})  grad error "
                  f"{result['grad_error']:.3f} bias {bias:.3f}  agree {result['agree']:.3f}",
                  flush=True)
    return results


def evaluate(model: Net, graph: Graph, x, y, masks) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        predicted = model(x).argmax(1)
    model.train()
    return {s: float((predicted[m] == y[m]).float().mean()) for s, m in masks.items()}


def train(args: ErrorArgs, name: str, graph: Graph, x, y, masks, dims, fraction: float) -> dict:
    """Part 2: one estimator (or "full", full batch) trained from the same initial weights."""
    torch.manual_seed(args.seed)
    model = Net(dims, 0.2, graph.full, args.backbone)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    s = max(1, round(fraction * graph.n))
    steps = 1 if name == "full" else max(1, math.ceil(graph.n / s - 1e-6))
    sampler = None if name == "full" else Sampler(name, graph, x, model)
    rng = np.random.default_rng([args.seed, 3])
    best, lowest, start = {"val": -1.0, "test": 0.0, "epoch": 0}, math.inf, time.perf_counter()
    for epoch in range(1, args.train_epochs + 1):
        if sampler is not None:
            sampler.refresh()
        losses = []
        for _ in range(steps):
            model.train()
            optimizer.zero_grad()
            if sampler is None:
                loss = sampled_loss(model(x), y, masks["train"])
            else:
                rows, p = draw(graph.n, s, rng)
                index = torch.from_numpy(rows)
                loss = sampled_loss(sampler.forward(rows, p)[-1], y[index],
                                    masks["train"][index])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        lowest = min(lowest, float(np.mean(losses)))
        if epoch % 5 == 0 or epoch == args.train_epochs:
            scores = evaluate(model, graph, x, y, masks)
            if scores["val"] > best["val"]:
                best = {"val": scores["val"], "test": scores["test"], "epoch": epoch}
    seconds = (time.perf_counter() - start) / args.train_epochs
    return {"estimator": name, "fraction": fraction if name != "full" else 1.0, "steps": steps,
            "test": best["test"], "val": best["val"], "best_epoch": best["epoch"],
            "lowest_loss": lowest, "seconds_per_epoch": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, ErrorArgs)
    args = dataclass_from_namespace(ErrorArgs, parser.parse_args())
    spec = proxy(args.proxy)
    config = replace(spec.config(args.scale, args.seed), **parse_overrides(args.set))
    data = generate_synthetic(config, split_seed=args.seed)
    print(f"{args.proxy} x{args.scale:g}: {describe(data)}", flush=True)
    graph = Graph(data.adjacency, args.backbone)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    masks = {"train": torch.from_numpy(data.train_mask), "val": torch.from_numpy(data.val_mask),
             "test": torch.from_numpy(data.test_mask)}
    layers = args.layers or spec.layers
    dims = [data.num_features] + [128] * (layers - 1) + [data.num_classes]
    header = {"proxy": args.proxy, "scale": args.scale, "overrides": parse_overrides(args.set),
              "layers": layers, "seed": args.seed, "backbone": args.backbone}
    records = []
    if args.warmup_epochs > 0 and args.fractions:
        torch.manual_seed(args.seed)
        model = Net(dims, 0.2, graph.full, args.backbone)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        previous = Net(dims, 0.2, graph.full, args.backbone)
        for epoch in range(args.warmup_epochs):
            previous.load_state_dict(model.state_dict())
            model.train()
            optimizer.zero_grad()
            sampled_loss(model(x), y, masks["train"]).backward()
            optimizer.step()
        scores = evaluate(model, graph, x, y, masks)
        print(f"part 1: a full-batch {args.backbone.upper()} of {layers} layers after "
              f"{args.warmup_epochs} epochs (test {100 * scores['test']:.2f}); {args.draws} "
              f"samples per row:", flush=True)
        records += [{**header, "part": "error", **r}
                    for r in measure(args, graph, x, y, masks["train"], model, previous)]
    if args.train_epochs > 0:
        fraction = args.fraction or spec.sample_size / spec.nodes
        print(f"part 2: training, s / n = {fraction:.4f}, {args.train_epochs} epochs:",
              flush=True)
        for name in ("full", *args.estimators):
            result = train(args, name, graph, x, y, masks, dims, fraction)
            records.append({**header, "part": "train", **result})
            print(f"  {name:12} {result['steps']:>2} steps/epoch: test "
                  f"{100 * result['test']:.2f} (epoch {result['best_epoch']}), lowest loss "
                  f"{result['lowest_loss']:.3f}, {result['seconds_per_epoch']:.2f} s/epoch",
                  flush=True)
    if args.json_out is not None:
        with open(args.json_out, "a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
