"""CPU cost of one client's sampled training step, without MPI (the exchange returns zeros).

    . .venv/bin/activate
    python benchmarks/bench_step.py --shards reports/accuracy/shards/amazon-computers-8 \
        [--client 0] [--steps 100] [--repeats 5]

What one client rank computes per step of ``ours`` (label-guided sample of ``--sample-size``
draws over all clients, by default the program's: n/4, n above 20,000 nodes; 2-layer GCN,
hidden 128, dropout 0.2), in one process on one torch thread: the phases of
``GNNMethod.train_step`` with the cross-client sums replaced by zeros of the right shape.
Prints the best of ``--repeats`` means over ``--steps`` steps (process CPU time, the least
disturbed by other load) and the phases' shares. Comparing commits: run it alternately
from two checkouts (``python /path/to/checkout/benchmarks/bench_step.py ...``); this virtual
machine's speed drifts by up to 30% within the hour. Asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import MISSING, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from mpifgl.config import TrainConfig  # noqa: E402
from mpifgl.graph import ClientGraph, build_operator  # noqa: E402
from mpifgl.model import flatten, gradients, select_rows, unflatten  # noqa: E402
from mpifgl.sampling import (NodeSampler, client_sample_sizes, default_sample_size,  # noqa: E402
                             group_counts, make_distribution, node_groups)
from fgl_common.shard_format import read_manifest  # noqa: E402
from mpifgl.communicator import LocalComm  # noqa: E402
from mpifgl.methods import build_trainer  # noqa: E402
import mpifgl.trainer as trainer_module  # noqa: E402


@dataclass(frozen=True)
class StepBenchArgs:
    shards: Path = option(MISSING, "shard directory written by data_prep", required=True)
    client: int = option(0, "client id whose step is measured")
    steps: int = option(100, "steps per measurement")
    repeats: int = option(5, "measurements; the best is printed")
    sample_size: int = option(0, "draws per step over all clients; 0: mpifgl.train's default")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, StepBenchArgs)
    args = dataclass_from_namespace(StepBenchArgs, parser.parse_args())
    manifest = read_manifest(str(args.shards))
    if not 0 <= args.client < manifest.num_clients:
        parser.error(f"--client {args.client}: expected 0..{manifest.num_clients - 1} "
                     f"({args.shards / 'manifest.json'} lists {manifest.num_clients} clients)")
    if args.steps < 1 or args.repeats < 1:
        parser.error(f"--steps {args.steps} --repeats {args.repeats}: expected at least 1 each")
    if args.sample_size < 0:
        parser.error(f"--sample-size {args.sample_size}: expected an integer >= 0")
    torch.set_num_threads(1)
    graphs = [ClientGraph.for_rank(str(args.shards), manifest, j)
              for j in range(manifest.num_clients)]
    classes = manifest.num_classes
    totals = sum(group_counts(node_groups(g.y, g.train_mask, classes), classes) for g in graphs)
    sizes = graphs[0].client_sizes
    total = args.sample_size or default_sample_size(int(sizes.sum()), "gcn")
    draws = client_sample_sizes(sizes, total)
    samplers = [NodeSampler(make_distribution("label", node_groups(g.y, g.train_mask, classes),
                                              totals), int(draws[j]), np.random.default_rng(j))
                for j, g in enumerate(graphs)]
    graph = graphs[args.client]
    # one client of a partition in a process of its own: the set-up's check that the shards
    # form one graph needs every client's share, so it is left out here (the model is the same)
    trainer_module.check_partition = lambda *args, **kwargs: None
    trainer = build_trainer(TrainConfig(shards=str(args.shards), sample_size=args.sample_size),
                            LocalComm(), graph,
                            classes).method

    class ZeroSum:
        """The cross-client sum's hook with the client's send-side product and no messages."""

        def __call__(self, plan, y):
            if plan.send_rows is not None:
                plan.send_rows.matmul(y.detach())
            return torch.zeros_like(y)

        def add_into(self, plan, y, total):
            self(plan, y)

    for layer in trainer.model.layers:
        layer.cross_sums = [ZeroSum()]

    phases: dict[str, float] = {}

    def step() -> None:
        clock = time.process_time()

        def tick(name: str) -> None:
            nonlocal clock
            now = time.process_time()
            phases[name] = phases.get(name, 0.0) + now - clock
            clock = now

        samples = [s.sample() for s in samplers]
        tick("sample (own only counted below)")
        operator = build_operator(graph, "gcn", [s.index for s in samples],
                                  samples[args.client].probability, trainer.dtype, exchanged=True)
        tick("build operator")
        trainer.model.train()
        trainer.optimizer.zero_grad(set_to_none=False)
        x = select_rows(trainer.x, operator.rows)
        tick("gather rows")
        logits = trainer.model(x, operator, trainer.setup.dropout_rng)
        tick("forward")
        train = torch.from_numpy(graph.train_mask)[operator.rows]
        loss = F.cross_entropy(logits[train], trainer.setup.y[operator.rows][train], reduction="sum")
        tick("loss")
        loss.backward()
        tick("backward")
        parameters = list(trainer.model.parameters())
        for p, grad in zip(parameters, unflatten(flatten(gradients(trainer.model)), parameters)):
            p.grad = grad
        tick("flatten gradients")
        trainer.optimizer.step()
        tick("optimizer")

    for _ in range(10):
        step()
    best = float("inf")
    for _ in range(args.repeats):
        phases.clear()
        start = time.process_time()
        for _ in range(args.steps):
            step()
        best = min(best, (time.process_time() - start) / args.steps)
    own_share = 1.0 / manifest.num_clients
    sample_key = "sample (own only counted below)"
    phases[sample_key] *= own_share  # the other clients' draws run on their own ranks
    total = sum(phases.values())
    print(f"{manifest.dataset}, client {args.client}: {graph.num_nodes} nodes, "
          f"{int(draws[args.client])} draws per step; one torch thread")
    print(f"best of {args.repeats} x {args.steps} steps: {1000 * best:.2f} ms per step "
          f"(all clients' sampling included); phases of the last repeat, own sampling only:")
    for name, seconds in phases.items():
        print(f"  {name.replace(' (own only counted below)', ''):18s} "
              f"{1000 * seconds / args.steps:7.3f} ms  {100 * seconds / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
