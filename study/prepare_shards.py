"""Prepare (or reuse) one shard directory of the study and print its sizes as one JSON line:

    python -m study.prepare_shards --dataset cora --num-clients 8 --partition random --out DIR
    {"num_nodes": ..., "num_train": ...}        (or {"error": "..."} and exit status 1)

The driver runs it as a subprocess, so the dataset loaders (torch, PyG) stay out of the driver.
The partition seed is always 0: every run of the study shares the same partitions.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option

PARTITION_SEED = 0


@dataclass(frozen=True)
class ShardRequest:
    dataset: str = option(None, "dataset name (data_prep's --dataset)", required=True)
    num_clients: int = option(None, "clients = shards", required=True)
    partition: str = option("random", "random | label-skew | metis | dirichlet | louvain | "
                                      "file:PATH (data_prep's --partition)")
    out: Path = option(None, "shard directory, reused when it holds these shards",
                       required=True)
    data_root: str | None = option(None, "raw datasets directory (data_prep's --data-root)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.prepare_shards",
                                     description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, ShardRequest)
    request = dataclass_from_namespace(ShardRequest, parser.parse_args(argv))
    from data_prep.api import prepare_shards  # after parsing: --help needs no torch
    try:
        manifest = prepare_shards(request.dataset, request.num_clients, request.partition,
                                  PARTITION_SEED, request.data_root, request.out,
                                  show_progress=False)
    except (ValueError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"num_nodes": manifest["num_nodes"], "num_train": manifest["num_train"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
