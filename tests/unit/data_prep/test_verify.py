"""``data_prep verify`` catches every kind of damage, and reports all of them at once."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from data_prep.verify import verify_shard_dir
from fgl_common import shard_format

from tests.helpers.data_prep_fixtures import SMALL_SYN, run_cli


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "shards"
    from data_prep.__main__ import main

    assert main([*SMALL_SYN, "--num-clients", "4", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture
def shards(pristine, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(pristine, copy)
    return copy


def rewrite(shard_dir, client, shard):
    """Write a modified shard and update its checksum, so only the intended damage remains."""
    path = shard_dir / shard_format.shard_filename(client)
    shard_format.write_client_shard(path, shard)
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    manifest["clients"][client]["sha256"] = shard_format.file_sha256(path)
    (shard_dir / "manifest.json").write_text(json.dumps(manifest))


def problems(shard_dir) -> str:
    report = verify_shard_dir(shard_dir)
    assert not report.ok
    return "\n".join(report.problems)


def test_clean_directory_verifies(shards, capsys):
    status, stdout, _ = run_cli(capsys, "verify", shards, "--quiet")
    assert status == 0 and "OK" in stdout


def test_missing_shard(shards):
    (shards / "client_2.h5").unlink()
    assert "client_2.h5: shard file missing" in problems(shards)


def test_extra_shard(shards):
    shutil.copy(shards / "client_0.h5", shards / "client_4.h5")
    assert "client_4.h5: unexpected file" in problems(shards)


def test_flipped_bytes(shards):
    path = shards / "client_1.h5"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))
    assert "client_1.h5: sha256 checksum mismatch" in problems(shards)


def test_truncated_file(shards):
    path = shards / "client_3.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    found = problems(shards)
    assert "client_3.h5: sha256 checksum mismatch" in found
    assert "client_3.h5: not a readable HDF5 file" in found or "unreadable" in found


def test_manifest_counts_edited(shards):
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["clients"][0]["num_nodes"] += 1
    manifest["clients"][1]["num_inner_edges"] += 5
    manifest["clients"][2]["class_counts"][0] -= 1
    manifest["num_features"] += 1
    (shards / "manifest.json").write_text(json.dumps(manifest))
    found = problems(shards)
    assert "clients' num_nodes add up to 601" in found
    assert "client_0.h5: " in found and "nodes, manifest says" in found
    assert "client_1.h5: num_inner_edges is" in found
    assert "client_2.h5: class_counts is" in found
    assert "features, manifest says 6" in found


def test_broken_transposition(shards):
    shard = shard_format.load_client_shard(shards / "client_0.h5")
    j = next(k for k in shard.blocks if k != 0)
    block = shard.blocks[j].tolil()
    row = int(np.flatnonzero(np.diff(shard.blocks[j].indptr))[0])
    col = block.rows[row][0]
    block[row, col] = 0  # drop one cross edge on this side only, degree adjusted to match
    shard.blocks[j] = sp.csr_matrix(block.tocsr())
    shard.blocks[j].eliminate_zeros()
    shard.degree[row] -= 1
    rewrite(shards, 0, shard)
    found = problems(shards)
    assert f"A_0{j} (in client_0.h5) is not the transpose of A_{j}0 (in client_{j}.h5)" in found


def test_duplicated_node_id(shards):
    shard = shard_format.load_client_shard(shards / "client_1.h5")
    other = shard_format.load_client_shard(shards / "client_2.h5")
    lost = int(shard.global_id[-1])
    shard.global_id[-1] = other.global_id[0]
    rewrite(shards, 1, shard)
    found = problems(shards)
    assert "node ids appear in more than one place" in found
    assert f"belong to no client ({lost}" in found


def test_every_problem_reported_together(shards, capsys):
    (shards / "client_2.h5").unlink()
    shutil.copy(shards / "client_0.h5", shards / "client_9.h5")
    path = shards / "client_1.h5"
    path.write_bytes(path.read_bytes()[:1000])
    status, stdout, _ = run_cli(capsys, "verify", shards, "--quiet")
    assert status == 1
    assert "client_2.h5: shard file missing" in stdout
    assert "client_9.h5: unexpected file" in stdout
    assert "client_1.h5: sha256 checksum mismatch" in stdout
    assert "problem(s) in" in stdout


def test_missing_directory_and_manifest(tmp_path, capsys):
    status, stdout, _ = run_cli(capsys, "verify", tmp_path / "nowhere", "--quiet")
    assert status == 1 and "does not exist" in stdout
    status, stdout, _ = run_cli(capsys, "verify", tmp_path, "--quiet")
    assert status == 1 and "manifest missing" in stdout


def test_non_finite_features(shards):
    path = shards / "client_1.h5"
    shard = shard_format.load_client_shard(path)
    shard.x[4, 2] = np.inf
    rewrite(shards, 1, shard)
    assert (f"{path}: /nodes/x holds non-finite values: inf at row 4 (global id "
            f"{shard.global_id[4]}), column 2; 1 row affected") in problems(shards)
