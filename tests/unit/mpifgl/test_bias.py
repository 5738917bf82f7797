"""Local-bias math on hand-made logits, run-directory reading and the CLI's error messages."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fgl_common.shard_format import ClientShard, write_client_shard
from mpifgl.bias import (BiasError, disagreement, local_bias, main, mean_distance,
                         node_distances, per_client_distance)



def test_mean_distance_hand_computed():
    run = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    ref = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 2.0]])
    # distances 0, 5, 1 -> mean 2
    assert node_distances(run, ref).tolist() == [0.0, 5.0, 1.0]
    assert mean_distance(run, ref) == pytest.approx(2.0)
    assert mean_distance(ref, ref) == 0.0


def test_disagreement_counts_other_predicted_classes_and_ignores_the_scale():
    ref = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    run = np.array([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0], [1.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    assert disagreement(run, ref) == pytest.approx(0.5)  # nodes 0 and 2 change class
    assert disagreement(ref * 7.0, ref) == 0.0 < mean_distance(ref * 7.0, ref)
    with pytest.raises(BiasError, match="shape"):
        disagreement(np.zeros((3, 2)), np.zeros((3, 4)))


def test_per_client_distance_uses_global_ids():
    run = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0], [2.0, 0.0]])
    ref = np.zeros((4, 2))
    # distances 0, 5, sqrt2, 2; client 0 = {1, 3}, client 1 = {0, 2}
    values = per_client_distance(run, ref, [np.array([1, 3]), np.array([2, 0])])
    assert values == pytest.approx([3.5, np.sqrt(2) / 2])


def test_shape_mismatch_is_a_bias_error():
    with pytest.raises(BiasError, match="shape"):
        mean_distance(np.zeros((3, 2)), np.zeros((3, 4)))
    with pytest.raises(BiasError, match="global id 7"):
        per_client_distance(np.zeros((3, 2)), np.zeros((3, 2)), [np.array([7])])


def _shard_dir(path: Path, clients: list[list[int]], dataset: str = "toy") -> Path:
    """A minimal shard directory: manifest + client_i.h5 with the given global ids."""
    path.mkdir(parents=True)
    n = sum(len(c) for c in clients)
    entries = []
    for i, ids in enumerate(clients):
        k = len(ids)
        shard = ClientShard(i, np.asarray(ids, dtype=np.int64), np.zeros((k, 1), np.float32),
                            np.zeros(k, np.int64), np.ones(k, bool), np.zeros(k, bool),
                            np.zeros(k, bool), np.zeros(k, np.int64),
                            attrs={"format_version": 1, "dataset": dataset,
                                   "num_clients": len(clients), "client_id": i,
                                   "partition": "random", "seed": 0})
        write_client_shard(path / f"client_{i}.h5", shard)
        entries.append({"client_id": i, "file": f"client_{i}.h5", "num_nodes": k,
                        "sha256": "x"})
    (path / "manifest.json").write_text(json.dumps(
        {"format_version": 1, "dataset": dataset, "partition": "random", "seed": 0,
         "num_clients": len(clients), "num_nodes": n, "num_features": 1, "num_classes": 2,
         "clients": entries}))
    return path


def _run_dir(path: Path, logits: np.ndarray | None, shards: Path, dataset: str = "toy",
             seed: int = 0, algo: str = "ours") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"shards": str(shards), "seed": seed,
                                                  "algo": algo}))
    (path / "final.json").write_text(json.dumps({"dataset": dataset, "test_micro_f1": 0.5}))
    if logits is not None:
        np.save(path / "logits.npy", logits)
    return path


def test_local_bias_report_per_client_and_noise(tmp_path):
    shards = _shard_dir(tmp_path / "shards", [[0, 2], [1, 3]])
    ref = np.zeros((4, 2))
    run = _run_dir(tmp_path / "run", np.array([[3.0, 4], [0, 1], [0, 0], [0, 0]]), shards)
    central = _run_dir(tmp_path / "c0", ref, shards, algo="centralized")
    noise = _run_dir(tmp_path / "c1", np.full((4, 2), 0.5), shards, seed=1, algo="centralized")
    report = local_bias(run, central, noise)
    assert report.local_bias == pytest.approx(1.5)  # (5 + 1) / 4
    assert report.per_client == pytest.approx([2.5, 0.5])
    assert report.client_sizes == [2, 2]
    assert report.noise_floor == pytest.approx(np.sqrt(0.5))
    assert report.disagreement == pytest.approx(0.5)  # nodes 0 and 1 predict class 1, not 0
    out = tmp_path / "bias.json"
    assert main([str(run), "--reference", str(central), "--noise-reference", str(noise),
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["local_bias"] == pytest.approx(1.5)


def test_cli_errors_are_one_line_without_traceback(tmp_path, capsys):
    shards = _shard_dir(tmp_path / "shards", [[0, 1]])
    no_logits = _run_dir(tmp_path / "nologits", None, shards)
    central = _run_dir(tmp_path / "central", np.zeros((2, 2)), shards, algo="centralized")
    other = _run_dir(tmp_path / "other", np.zeros((2, 2)), shards, dataset="cora")
    wide = _run_dir(tmp_path / "wide", np.zeros((2, 3)), shards)

    assert main([str(no_logits), "--reference", str(central)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mpifgl.bias: error: ") and err.count("\n") == 1
    assert "re-run the training with --save-logits" in err
    with pytest.raises(BiasError, match="'cora'.*'toy'"):
        local_bias(other, central)
    with pytest.raises(BiasError, match=r"shape \(2, 3\)"):
        local_bias(wide, central)
    with pytest.raises(BiasError, match="does not exist"):
        local_bias(tmp_path / "nowhere", central)




def test_the_report_says_what_the_figure_is_and_how_to_judge_it(tmp_path, capsys):
    shards = _shard_dir(tmp_path / "shards", [[0, 2], [1, 3]])
    run = _run_dir(tmp_path / "run", np.array([[3.0, 4], [0, 1], [0, 0], [0, 0]]), shards)
    central = _run_dir(tmp_path / "c0", np.zeros((4, 2)), shards, algo="centralized")
    noise = _run_dir(tmp_path / "c1", np.full((4, 2), 0.5), shards, seed=1, algo="centralized")
    assert main([str(run), "--reference", str(central)]) == 0
    alone = capsys.readouterr().out
    assert "the mean over nodes of the Euclidean distance between this run's output logits " \
           "and the centralized reference's" in alone
    assert "pass --noise-reference with a second centralized run of another --seed" in alone
    assert main([str(run), "--reference", str(central), "--noise-reference", str(noise)]) == 0
    judged = capsys.readouterr().out
    assert "noise floor: 0.7071" in judged and "bias / noise = 2.12" in judged
    assert "differ from centralized training by 2.12 times the seed noise" in judged


# -- what bias reads is checked against the runs' records (runs trained here, in-process) -------
@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_graph):
    """Runs trained in this process (centralized, with logits), by name: on partitions of the
    toy graph into 2 (run, fedavg: its record says --algo fedavg), 1 (merged) and 3 (three)
    clients, and on a graph of 4 classes (other). Their shards are in shards-NAME beside."""
    from mpifgl import train
    from tests.helpers.graphs import random_graph, random_parts, write_shards
    root = tmp_path_factory.mktemp("bias-runs")
    other = random_graph(n=60, avg_degree=5, d=7, classes=4, seed=11)
    made = {}
    for name, clients, graph in (("run", 2, toy_graph), ("fedavg", 2, toy_graph),
                                 ("merged", 1, toy_graph), ("three", 3, toy_graph),
                                 ("other", 2, other)):
        shards = write_shards(graph, random_parts(graph.num_nodes, clients, 0),
                              root / f"shards-{name}")
        made[name] = run = root / name
        assert train.main(["--algo", "centralized", "--hidden", "8", "--epochs", "2",
                           "--log-every", "100", "--save-logits", "--shards", str(shards),
                           "--out", str(run)]) == 0
    config = json.loads((made["fedavg"] / "config.json").read_text())
    (made["fedavg"] / "config.json").write_text(json.dumps({**config, "algo": "fedavg"}))
    return made


def test_bias_checks_its_reference_and_shards_against_the_runs_records(runs, capsys):
    from tests.helpers.graphs import random_graph, random_parts, write_shards
    run, merged, other_partition = runs["run"], runs["merged"], runs["three"]
    # the reference may be on any partition of the run's graph: logits are in global order
    assert local_bias(run, merged).client_sizes == [30, 30]
    assert local_bias(run, other_partition, merged).noise_floor is not None
    not_central = runs["fedavg"]
    assert main([str(run), "--reference", str(not_central)]) == 1
    assert capsys.readouterr().err == (
        f"mpifgl.bias: error: --reference {not_central}: its config.json says --algo fedavg, "
        f"expected --algo centralized: local bias is measured against the model trained "
        f"centrally on the whole graph (`python -m mpifgl.train --algo centralized "
        f"--save-logits ...`)\n")
    with pytest.raises(BiasError, match="^--noise-reference .* says --algo fedavg"):
        local_bias(run, merged, not_central)
    other_graph = runs["other"]
    with pytest.raises(BiasError, match=rf"^{run} was trained on another graph \(toy, 60 nodes, "
                                        rf"3 classes, split test; graph [0-9a-f]{{16}}\) than the "
                                        rf"reference {other_graph} \(toy, 60 nodes, 4 classes"):
        local_bias(run, other_graph)
    # client membership from another partition of the same graph: refused, naming both
    another = run.parent / "shards-three"
    status = main([str(run), "--reference", str(merged), "--shards", str(another)])
    error = capsys.readouterr().err
    assert status == 1 and error.startswith(
        f"mpifgl.bias: error: --shards {another}: these shards (fingerprint ") and (
        f": toy, test partition seed 0, 3 clients, 60 nodes) are not the partition {run} was "
        f"trained on (fingerprint ") in error and error.endswith(
        "so the per-client figures would be wrong: pass the shards it was trained on, or leave "
        "out --shards\n")
    own = run.parent / "shards-run"  # re-made in place with another partition since the run
    for name in ("client_0.h5", "client_1.h5", "manifest.json"):
        (own / name).write_bytes((run.parent / "shards-fedavg" / name).read_bytes())
    assert local_bias(run, merged).client_sizes == [30, 30]  # the same partition: accepted
    write_shards(random_graph(n=60, avg_degree=5, d=7, classes=3, seed=11),
                 random_parts(60, 2, seed=5), own)
    with pytest.raises(BiasError, match=rf"^{run}'s shards {own}: these shards .* they were "
                                        rf"re-made or replaced since"):
        local_bias(run, merged)


def test_a_bias_report_never_replaces_a_file_of_a_run(runs, capsys):
    run, reference = runs["three"], runs["merged"]
    before = (run / "final.json").read_bytes()
    assert main([str(run), "--reference", str(reference), "--json", str(run / "final.json")]) == 1
    assert capsys.readouterr().err == (
        f"mpifgl.bias: error: --json {run / 'final.json'}: refusing to replace final.json in "
        f"the run directory {run}: it is a file of that run; choose a new file name\n")
    assert (run / "final.json").read_bytes() == before
    for _ in range(2):  # a report of its own, written again
        assert main([str(run), "--reference", str(reference), "--json",
                     str(run / "bias.json")]) == 0
    assert json.loads((run / "bias.json").read_text())["reference"] == str(reference)
