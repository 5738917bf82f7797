"""Bytes of the cross-client exchange per exchange mode, on amazon-computers.

    . .venv/bin/activate
    python benchmarks/bench_exchange_bytes.py [--work /tmp/mpifgl-bytes] [--clients 4,8,16,32]
        [--partitions random,metis] [--modes compact,compact-reduce,reduce] [--data-root DIR]

Prepares the shards it needs under --work (``python -m data_prep``, skipped when present), runs
``ours`` (label-guided sampling, default s = ceil(n/4) draws, 4 steps per epoch, hidden 128,
2 layers, float32) for 2 epochs per mode and reads epoch 1 of metrics.jsonl (training only: the
full-graph evaluation runs at epoch 2). Prints per run, per epoch:

* exch sent / exch recv: a client's ``exchange_bytes_sent`` / ``_received`` (the cross-client
  terms forward and backward, plus their row ids and the chunk metadata), mean over clients;
* total sent / total recv: the same for all of a client's traffic (also the weight-gradient sum
  and the sample allgather);
* server recv / server sent: the server's exchange bytes;
* vs reduce: exch sent against the dense ``reduce`` exchange of the same shards;
* formula: the paper's Table 1 communication m * n_S * L * d per step, here per client and per
  epoch: n_S * L * d * 4 bytes * 2 (forward and backward) * steps, with n_S = s (the draws, an
  upper bound of the distinct sampled nodes), L = 2 and d = 128 (the hidden width; the last
  layer's width is the number of classes, 10, so the dense exchange is below the formula).

Traffic is counted as logical payload (what a rank hands to or gets from MPI), as in comm.py.
32 clients means 33 ranks: on a 2-core machine each run takes minutes. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option  # noqa: E402
from fgl_common.launch import mpirun_path  # noqa: E402
from study.runner import subprocess_env  # noqa: E402
from study.rundir import read_metrics  # noqa: E402

DATASET = "amazon-computers"
HIDDEN, LAYERS, ITEMSIZE, STEPS = 128, 2, 4, 4


@dataclass(frozen=True)
class ExchangeBytesArgs:
    work: Path = option(Path("/tmp/mpifgl-bytes"), "shards and runs go here")
    clients: tuple[int, ...] = option((4, 8, 16, 32), "comma-separated client counts")
    partitions: tuple[str, ...] = option(("random", "metis"), "comma-separated data_prep "
                                                              "--partition values")
    modes: tuple[str, ...] = option(("compact", "compact-reduce", "reduce"),
                                    "comma-separated mpifgl.train --exchange values")
    data_root: str = option("", "raw datasets directory (data_prep's --data-root); empty: its "
                                "default")


def prepare(work: Path, clients: int, partition: str, data_root: str) -> Path:
    shards = work / "shards" / f"{DATASET}-{partition}-{clients}"
    if (shards / "manifest.json").exists():
        return shards
    command = [sys.executable, "-m", "data_prep", "--dataset", DATASET, "--num-clients",
               str(clients), "--partition", partition, "--seed", "0", "--out", str(shards),
               "--quiet"]
    if data_root:
        command += ["--data-root", data_root]
    subprocess.run(command, check=True, env=subprocess_env(), cwd=REPO, timeout=1800)
    return shards


def run(shards: Path, out: Path, clients: int, mode: str) -> dict:
    command = [mpirun_path(), "-n", str(clients + 1), sys.executable, "-m", "mpifgl.train",
               "--shards", str(shards), "--out", str(out), "--epochs", "2", "--eval-every", "20",
               "--exchange", mode, "--force"]
    done = subprocess.run(command, env=subprocess_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    first = read_metrics(out)[0]
    assert first["epoch"] == 1
    return first


def mean_over_clients(values: list[int]) -> float:
    return sum(values[1:]) / max(1, len(values) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_dataclass_arguments(parser, ExchangeBytesArgs)
    args = dataclass_from_namespace(ExchangeBytesArgs, parser.parse_args())
    modes = args.modes
    header = (f"{'partition':9} {'m':>3} {'mode':15} {'exch sent':>10} {'exch recv':>10} "
              f"{'total sent':>10} {'total recv':>10} {'server recv':>11} {'server sent':>11} "
              f"{'vs reduce':>9} {'formula':>9} {'seconds':>7}")
    rows = []
    for partition in args.partitions:
        for clients in args.clients:
            shards = prepare(args.work, clients, partition, args.data_root)
            num_nodes = json.loads((shards / "manifest.json").read_text())["num_nodes"]
            sample = -(-num_nodes // 4)
            formula = sample * LAYERS * HIDDEN * ITEMSIZE * 2 * STEPS
            measured = {}
            for mode in modes:
                start = time.perf_counter()
                record = run(shards, args.work / "runs" / f"{partition}-{clients}-{mode}",
                             clients, mode)
                measured[mode] = (record, time.perf_counter() - start)
            dense = (mean_over_clients(measured["reduce"][0]["exchange_bytes_sent"])
                     if "reduce" in measured else float("nan"))
            for mode, (record, seconds) in measured.items():
                sent = mean_over_clients(record["exchange_bytes_sent"])
                line = (f"{partition:9} {clients:3d} {mode:15} {sent / 2**20:9.2f}M "
                        f"{mean_over_clients(record['exchange_bytes_received']) / 2**20:9.2f}M "
                        f"{mean_over_clients(record['bytes_sent']) / 2**20:9.2f}M "
                        f"{mean_over_clients(record['bytes_received']) / 2**20:9.2f}M "
                        f"{record['exchange_bytes_received'][0] / 2**20:10.2f}M "
                        f"{record['exchange_bytes_sent'][0] / 2**20:10.2f}M "
                        f"{sent / dense:9.3f} {sent / formula:9.3f} {seconds:7.0f}")
                rows.append(line)
                print(line if len(rows) > 1 else header + "\n" + line, flush=True)
    print("\n" + header)
    print("\n".join(rows))
    print("MB = 2^20 bytes per client per epoch (mean over clients); vs reduce and formula: "
          "ratios of exch sent")


if __name__ == "__main__":
    main()
