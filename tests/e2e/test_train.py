"""python -m mpifgl.train end to end: the centralized baselines' run directories, the default
run on Cora, one-line errors for a failed preparation and for bad flags."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from data_prep.catalog import KNOWN_DATASETS

from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import mpi_env, run_mpi, run_python
from tests.helpers.runs import TINY, TRAIN, check_run_dir, run_ok


@pytest.mark.timeout(150)
def test_default_run_reports_a_failed_preparation_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mpifgl.train", "--algo", "centralized",
                           "--dataset", "nosuch", "--epochs", "1"], env=mpi_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "mpifgl.train: error: preparing the default shards in shards/nosuch-random-m8-s0 failed: "
        "unknown dataset 'nosuch'; known datasets: " + ", ".join(KNOWN_DATASETS)]
    assert not (tmp_path / "shards").exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo,keys", [
    ("graphsage", ["layers.0.lin_l.weight", "layers.0.lin_l.bias", "layers.0.lin_r.weight"]),
    ("graphsaint", ["layers.0.lin.weight", "layers.0.bias"])])
def test_centralized_baselines_end_to_end(toy_graph, toy_shards, tmp_path, algo, keys):
    shard_dir = toy_shards(2)
    run_ok(run_python(TRAIN + ["--algo", algo, "--shards", str(shard_dir), "--epochs", "3",
                               "--batch-size", "8", "--fanouts", "4,3", "--out",
                               str(tmp_path / algo), *TINY], timeout=240))
    weights = check_run_dir(tmp_path / algo, toy_graph.num_nodes, toy_graph.num_classes, 3)
    assert set(keys) <= set(weights)
    assert f"layers.1.{keys[0].split('.', 2)[2]}" in weights
    layer_of = [int(name.split(".")[1]) for name in weights]
    assert layer_of == sorted(layer_of), "state_dict keys must name the layers in order"


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_centralized_refuses_many_ranks_and_bad_flags(toy_shards, tmp_path):
    shards = toy_shards(2)
    done = run_mpi(3, [*TRAIN, "--algo", "centralized", "--shards", str(shards)], timeout=60)
    assert done.returncode == 2 and done.stderr.count("runs in one process") == 1
    done = run_python([*TRAIN, "--algo", "centralized", "--shards", str(shards), "--layers", "0"])
    assert done.returncode == 2 and "--layers is 0, expected an integer >= 1" in done.stderr
    out = tmp_path / "central"
    run_ok(run_python([*TRAIN, "--algo", "centralized", "--shards", str(shards), "--out", str(out),
                   "--epochs", "2"]))
    # An existing run is never overwritten without --force.
    before = (out / "metrics.jsonl").read_bytes()
    done = run_python([*TRAIN, "--algo", "centralized", "--shards", str(shards), "--out", str(out),
                       "--epochs", "2"])
    assert done.returncode == 1 and "already holds a run" in done.stderr
    assert (out / "metrics.jsonl").read_bytes() == before
    # --force starts a new run there: no line or file of the old one stays behind.
    (out / "logits.npy").write_bytes(b"stale")
    run_ok(run_python([*TRAIN, "--algo", "centralized", "--shards", str(shards), "--out", str(out),
                   "--epochs", "1", "--force"]))
    epochs = [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1]
    assert not (out / "logits.npy").exists()
    assert json.loads((out / "final.json").read_text())["epochs"] == 1


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_default_run_prepares_cora_and_trains(tmp_path):
    """`mpirun -n 3 python -m mpifgl.train` with no data flags, in an empty directory: prepares
    the default dataset's shards (offline, from ../shared/data) and trains on them."""
    done = run_ok(run_mpi(3, [*TRAIN, "--epochs", "3"], timeout=240, cwd=tmp_path))
    manifests = list((tmp_path / "shards").glob("*/manifest.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())["num_clients"] == 2
    finals = list((tmp_path / "runs").glob("*/final.json"))
    assert len(finals) == 1
    assert json.loads(finals[0].read_text())["dataset"] == "cora"
    assert "epoch    3" in done.stdout


@pytest.mark.timeout(120)
def test_centralized_run_records_its_dataset_and_labels_its_log(toy_shards, tmp_path):
    done = run_python([*TRAIN, "--algo", "centralized", "--shards", str(toy_shards(2)), "--out",
                       str(tmp_path / "run"), "--epochs", "2"])
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["dataset"] == "toy"
    epoch_line = next(line for line in done.stdout.splitlines() if "epoch    2" in line)
    for label in ("loss", "micro-F1 train", "val", "test", "time", "traffic", "MiB"):
        assert label in epoch_line, epoch_line
    summary = done.stdout.strip().splitlines()[-1]
    assert re.match(r"\[central\] done in [\d.]+ s: 2 epochs, training [\d.]+ s per epoch, "
                    r"evaluation [\d.]+ s in all \(2 evaluations\); traffic none \(one "
                    r"process\); peak memory \d+ MiB; best val micro-F1 [\d.]+ at epoch \d "
                    r"\(train [\d.]+, test [\d.]+\) -> ", summary), summary
    drawn = run_python(["-m", "mpifgl.plot", str(tmp_path / "run")])
    assert drawn.returncode == 0 and (tmp_path / "run" / "metrics.png").is_file(), drawn.stderr
    done = run_python([*TRAIN, "--algo", "centralized", "--shards", str(toy_shards(2)),
                       "--epochs", "0"])
    assert done.returncode == 2 and "--epochs is 0, expected an integer >= 1" in done.stderr


@pytest.mark.needs_mount
@pytest.mark.timeout(240)
def test_a_checkpoint_on_a_full_disk_is_named_and_the_previous_one_kept(cora_graph, tmp_path,
                                                                        tiny_fs):
    """Cora onto a 3 MB file system: the first checkpoint fits, the second does not
    (its temporary copy needs as much again). One line names checkpoint.pt with the free and
    the needed bytes; the first checkpoint is intact and --resume continues from it."""
    shards = write_shards(cora_graph, random_parts(cora_graph.num_nodes, 2), tmp_path / "shards",
                          dataset="cora")
    run = tiny_fs(3 * 2 ** 20) / "run"
    done = run_python([*TRAIN, "--algo", "centralized", "--shards", str(shards), "--out",
                       str(run), "--epochs", "4", "--checkpoint-every", "1"], timeout=200)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("mpifgl.train:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"mpifgl.train: error while writing the checkpoint of epoch 2: "
                               f"{run}/checkpoint.pt: No space left on device (the file system "
                               f"has ")
    assert lines[0].endswith(f"; files kept in {run}; continue from its checkpoint of epoch 1 "
                             f"with: python -m mpifgl.train --resume {run}")
    import torch
    assert torch.load(run / "checkpoint.pt", weights_only=False)["epoch"] == 1
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.json",
                                                     "metrics.jsonl"]
