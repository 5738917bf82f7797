"""CAGNET's bytes per client per training epoch, measured, beside its volume formula.

    . .venv/bin/activate
    python benchmarks/bench_cagnet_bytes.py --work /tmp/mpifgl-cagnet-bytes
        [--dataset cora] [--clients 4,8] [--replication 1,2] [--epochs 3] [--layers 2]
        [--hidden 16] [--dtype float32] [--data-root DIR]

For each client count M: ``python -m data_prep`` writes the shards (random partition, seed 0;
reused when --work holds them already); then for each replication c dividing M, ``mpirun -n M+1
python -m mpifgl.train --algo cagnet --replication c`` runs --epochs epochs, evaluated at the
last only. The epochs without evaluation give each client's measured bytes (metrics.jsonl,
per_rank bytes_sent / bytes_received: every collective as the communicator counts it), printed
beside two formulas:

  exact    ``mpifgl.methods.cagnet.step_traffic``: the schedule's collectives with our block
           sizes (block rows cut at client boundaries) and layer widths, counted as logical
           payload (a broadcast's root sends a copy to each other rank, an allreduce sends and
           receives its buffer): forward, the SpMM of each layer's input (widths d_0..d_{L-1}),
           backward, of each layer's output gradient (d_1..d_L), each layer's weight and bias
           gradient allreduce over the column group, the loss's allreduce, and client 0's
           message of the step's gradients to the server (the run's bookkeeping);
  volume   CAGNET's per-SpMM volume per rank (docs/algorithms.md): n f / c words by the
           broadcasts plus 2 (c - 1) n f / P for the row group's allreduce (a ring's), the same
           SpMM widths, plus the gradients' and the loss's allreduce. Its broadcast term counts
           every stage a rank takes part in, its own block's too (the reference's bcast_words
           does the same), so it is compared with the measured received bytes plus the rank's
           own broadcasts (its block's bytes in the stages it is the root of: 0 or n_b f per
           SpMM, from the block sizes); received alone is below it by those (with c = 1, 1/P).

Then the difference of the measured bytes from each, in percent. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_products import run_command  # noqa: E402
from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from mpifgl.methods.cagnet import block_sizes, step_traffic, stage_blocks  # noqa: E402
from study import rundir  # noqa: E402
from study.runner import subprocess_env  # noqa: E402

MB = 2 ** 20


@dataclass(frozen=True)
class BytesBenchArgs:
    work: Path = option(Path("/tmp/mpifgl-cagnet-bytes"), "shards and runs go here")
    dataset: str = option("cora", "data_prep --dataset")
    clients: tuple[int, ...] = option((4, 8), "comma-separated client counts")
    replication: tuple[int, ...] = option((1, 2), "comma-separated replication factors c")
    epochs: int = option(3, "epochs per run; the last one evaluates")
    layers: int = option(2, "mpifgl.train --layers")
    hidden: int = option(16, "mpifgl.train --hidden")
    dtype: str = option("float32", "mpifgl.train --dtype", ("float32", "float64"))
    data_root: str = option("", "data_prep --data-root (empty: its default)")


def prepare(args: BytesBenchArgs, clients: int) -> Path:
    """Shards of --dataset over ``clients`` clients (reused when there already)."""
    out = args.work / f"shards-{args.dataset}-random-{clients}clients"
    if (out / "manifest.json").is_file():
        return out
    command = [sys.executable, "-m", "data_prep", "--dataset", args.dataset, "--num-clients",
               str(clients), "--partition", "random", "--seed", "0", "--out", str(out), "--quiet"]
    if args.data_root:
        command += ["--data-root", args.data_root]
    if subprocess.run(command, env=subprocess_env(), cwd=REPO).returncode != 0:
        raise SystemExit(f"preparing {out} failed: {' '.join(command)}")
    return out


def volume_formula(num_nodes: int, clients: int, c: int, widths: list[int],
                   itemsize: int) -> float:
    """CAGNET's received bytes per rank per step: per SpMM of width f, n f / c by broadcast and
    2 (c - 1) n f / P by the row allreduce; plus the weight gradients' allreduce and the loss."""
    spmm = sum(num_nodes * f / c + 2 * (c - 1) * num_nodes * f / clients
               for f in widths[:-1] + widths[1:])
    gradients = sum(widths[k] * widths[k + 1] + widths[k + 1] for k in range(len(widths) - 1))
    return (spmm + (gradients + 1 if clients // c > 1 else 0)) * itemsize


def own_broadcasts(sizes: list[int], c: int, widths: list[int], itemsize: int) -> list[int]:
    """Per client, the bytes of its own block in the stages it broadcasts (it is their root)."""
    blocks = block_sizes(sizes, c)
    spmm = sum(widths[:-1] + widths[1:])
    return [int(blocks[k // c]) * spmm * itemsize
            if k // c in stage_blocks(k % c, c, len(blocks)) else 0 for k in range(len(sizes))]


def measured(out: Path) -> list[tuple[float, float]] | None:
    """Each client's (sent, received) bytes, mean over the epochs without evaluation."""
    records = [r for r in rundir.read_metrics(out) if "val_micro_f1" not in r]
    if not records:
        return None
    sent = [r["per_rank"]["bytes_sent"] for r in records]
    received = [r["per_rank"]["bytes_received"] for r in records]
    return [(mean(s[k] for s in sent), mean(r[k] for r in received))
            for k in range(1, len(sent[0]))]


def percent(found: float, expected: float) -> str:
    return f"{100 * (found - expected) / expected:+.2f}%" if expected else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, BytesBenchArgs)
    args = dataclass_from_namespace(BytesBenchArgs, parser.parse_args())
    if args.epochs < 2:
        parser.error(f"--epochs is {args.epochs}, expected at least 2 (one without evaluation)")
    args.work.mkdir(parents=True, exist_ok=True)
    itemsize = 8 if args.dtype == "float64" else 4
    lines = []
    for clients in args.clients:
        shards = prepare(args, clients)
        manifest = json.loads((shards / "manifest.json").read_text())
        sizes = [c["num_nodes"] for c in manifest["clients"]]
        widths = [manifest["num_features"]] + [args.hidden] * (args.layers - 1) + \
            [manifest["num_classes"]]
        for c in args.replication:
            if clients % c:
                print(f"skipped: c = {c} does not divide {clients} clients")
                continue
            out = args.work / "runs" / f"cagnet-m{clients}-c{c}"
            command = [sys.executable, "-m", "mpifgl.train", "--algo", "cagnet",
                       "--replication", str(c), "--shards", str(shards), "--out", str(out),
                       "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
                       "--layers", str(args.layers), "--hidden", str(args.hidden),
                       "--dtype", args.dtype, "--force"]
            start = time.perf_counter()
            outcome = run_command("cagnet", clients, command, out, True, 3600.0)
            print(f"   {time.perf_counter() - start:.0f} s", flush=True)
            found = measured(out) if outcome.status == "done" else None
            if found is None:
                lines.append(f"M={clients} c={c}: {outcome.status}")
                continue
            exact = step_traffic(sizes, c, widths, itemsize)
            volume = volume_formula(sum(sizes), clients, c, widths, itemsize)
            own = own_broadcasts(sizes, c, widths, itemsize)
            for client, ((sent, received), (x_sent, x_received)) in enumerate(zip(found, exact)):
                taken_part = received + own[client]
                lines.append(f"M={clients:<2} c={c} client {client:<2}  sent {sent / MB:8.3f} "
                             f"exact {x_sent / MB:8.3f} {percent(sent, x_sent):>7}  received "
                             f"{received / MB:8.3f} exact {x_received / MB:8.3f} "
                             f"{percent(received, x_received):>7}  received + own broadcasts "
                             f"{taken_part / MB:8.3f} volume {volume / MB:8.3f} "
                             f"{percent(taken_part, volume):>7}")
    print(f"\n{args.dataset}, {args.layers} layers, hidden {args.hidden}, {args.dtype}: MB per "
          f"client per training epoch (epochs without evaluation)\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
