"""fgl_common.shard_identity: a shard directory's fingerprint, and the evidence (summed over
ranks) that the clients' shards are one partition of one graph, on tiny hand-made shards."""
from __future__ import annotations

import numpy as np
import pytest

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from fgl_common.shard_identity import fingerprint, partition_evidence, partition_problems
from mpifgl.graph import ClientGraph
from tests.helpers.graphs import random_parts, tamper_shard, write_shards


def summed_evidence(shard_dir) -> tuple[np.ndarray, list[int]]:
    """What the sum over ranks gives: the server's zeros plus every client's evidence."""
    sizes = read_manifest(shard_dir).client_sizes()
    total = partition_evidence(-1, sizes, np.zeros(0, np.int64), None, None)
    for i in range(len(sizes)):
        graph = ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(i)), sizes)
        total = total + partition_evidence(i, sizes, graph.global_id, graph.inner, graph.cross)
    return total, sizes


def test_one_partition_passes_in_any_world(toy_graph, tmp_path):
    for m in (1, 2, 3):
        shard_dir = write_shards(toy_graph, random_parts(60, m), tmp_path / f"m{m}")
        total, sizes = summed_evidence(shard_dir)
        assert partition_problems(total, sizes, shard_filename) == []
    shards = [load_client_shard(shard_dir / shard_filename(i)) for i in range(3)]
    merged = ClientGraph.merged(shards)  # one process: the whole graph as one client
    evidence = partition_evidence(0, [60], merged.global_id, merged.inner, merged.cross)
    assert partition_problems(evidence, [60], shard_filename) == []


def test_a_client_file_of_another_partition_is_named(toy_graph, tmp_path):
    shard_dir = write_shards(toy_graph, random_parts(60, 3, seed=0), tmp_path / "a")
    other = write_shards(toy_graph, random_parts(60, 3, seed=1), tmp_path / "b")
    tamper_shard(shard_dir, 1, source=other / shard_filename(1))  # same sizes, checksum fixed
    total, sizes = summed_evidence(shard_dir)
    problems = partition_problems(total, sizes, shard_filename)
    assert problems[0].startswith("the clients' global node ids do not cover 0..59 exactly once")
    assert any(p.startswith("A_0,1 in client_0.h5") for p in problems)
    assert problems[-1] == ("client_1.h5 disagrees with every shard it shares edges with: it "
                            "is likely from another partition or dataset")


def test_an_edge_known_to_one_end_only_is_named(toy_graph, tmp_path):
    shard_dir = write_shards(toy_graph, random_parts(60, 2), tmp_path / "a")
    sizes = read_manifest(shard_dir).client_sizes()
    graphs = [ClientGraph.from_shard(load_client_shard(shard_dir / shard_filename(i)), sizes)
              for i in range(2)]
    cross = graphs[0].cross.tolil()
    cross[0, sizes[0] + 5] = 1 - cross[0, sizes[0] + 5]  # one entry of A_01 flipped
    total = sum(partition_evidence(i, sizes, g.global_id, g.inner,
                                   cross.tocsr() if i == 0 else g.cross)
                for i, g in enumerate(graphs))
    problems = partition_problems(total, sizes, shard_filename)
    assert len(problems) == 1 and "is not the transpose of A_1,0 in client_1.h5" in problems[0]


def test_fingerprint_names_the_files_and_the_partition(toy_graph, tmp_path):
    a = write_shards(toy_graph, random_parts(60, 2, seed=0), tmp_path / "a")
    again = write_shards(toy_graph, random_parts(60, 2, seed=0), tmp_path / "again")
    other = write_shards(toy_graph, random_parts(60, 2, seed=1), tmp_path / "other")
    assert fingerprint(read_manifest(a).raw) == fingerprint(read_manifest(again).raw)
    assert fingerprint(read_manifest(a).raw) != fingerprint(read_manifest(other).raw)
    tamper_shard(a, 0, x=lambda x: x + 1)
    assert fingerprint(read_manifest(a).raw) != fingerprint(read_manifest(again).raw)
    assert len(fingerprint(read_manifest(a).raw)) == 16


@pytest.mark.parametrize("ids", [[0, 1, 1], [0, 1, 7]])
def test_global_ids_twice_or_outside_are_found(ids):
    sizes = [3]
    evidence = partition_evidence(0, sizes, np.array(ids), np.zeros((3, 3)), np.zeros((3, 3)))
    problems = partition_problems(evidence, sizes, shard_filename)
    assert len(problems) == 1 and "do not cover 0..2 exactly once" in problems[0]


def test_evidence_does_not_depend_on_the_hashing_blocks(toy_graph, tmp_path, monkeypatch):
    """Rows are hashed in blocks of about ENTRY_BLOCK entries to bound memory: blocks of one
    row (and of fewer entries than a row holds) sum to what one block gives."""
    import fgl_common.shard_identity as identity
    shard_dir = write_shards(toy_graph, random_parts(60, 3), tmp_path / "a")
    whole, sizes = summed_evidence(shard_dir)
    for block in (1, 5):
        monkeypatch.setattr(identity, "ENTRY_BLOCK", block)
        blocked, _ = summed_evidence(shard_dir)
        assert np.array_equal(blocked, whole)
