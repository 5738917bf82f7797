"""mpifgl.exchange under mpirun: the bytes a run records are exactly the plan's non-zero rows."""
from __future__ import annotations

import json

import pytest
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from tests.helpers.mpi import run_mpi
from mpifgl.graph import ClientGraph, build_operator


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks,buffer_mb,wire", [(3, "1e-6", "same"), (5, "256", "same"),
                                                  (3, "256", "bfloat16")])
def test_compact_exchange_bytes_are_the_non_zero_rows(toy_shards, tmp_path, ranks, buffer_mb,
                                                      wire):
    """Full-graph training (plan prepared before the epoch): each client's exchange_bytes_sent
    is exactly its touched rows' values (both directions of every layer, plus the evaluation's
    forward), whatever the chunking, at 4 bytes a value (2 with --wire-dtype bfloat16, which
    travels as raw 16-bit words); the totals include them."""
    shards = toy_shards(ranks - 1, seed=2)
    out = tmp_path / "run"
    done = run_mpi(ranks, ["-m", "mpifgl.train", "--shards", str(shards), "--out", str(out),
                       "--epochs", "1", "--sampling", "none", "--hidden", "8",
                       "--exchange-buffer-mb", buffer_mb, "--wire-dtype", wire], timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    manifest = read_manifest(shards)
    widths = 8 + manifest.num_classes  # two layers
    size = 2 if wire == "bfloat16" else 4
    for i in range(ranks - 1):
        graph = ClientGraph.from_shard(load_client_shard(shards / shard_filename(i)),
                                       manifest.client_sizes())
        plan = build_operator(graph, "gcn", None, None, torch.float32, True).exchange
        expected = plan.touched.shape[0] * widths * size * 3  # forward, backward, evaluation
        assert record["exchange_bytes_sent"][i + 1] == expected
        received = plan.receive_rows.shape[0] * widths * size * 3
        assert record["exchange_bytes_received"][i + 1] == received
        assert record["bytes_sent"][i + 1] > expected
    assert record["exchange_bytes_received"][0] == sum(record["exchange_bytes_sent"][1:])
