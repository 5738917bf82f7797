"""mpifgl.train in-process: the default run prepares its shards through the data_prep program
(its subprocess replaced here; tests/e2e/test_train.py runs it for real); the program's rules in
one process or in threads: resume, a run stopped before its first checkpoint, a non-finite loss,
an out-of-range sample size, shards that are not who they say they are."""
from __future__ import annotations

import json
import re
import socket
import subprocess

import numpy as np
import pytest

from mpifgl.config import TrainConfig
from tests.helpers import dead_pid
from tests.helpers.graphs import random_parts, tamper_shard, write_shards
from tests.helpers.runs import threaded_program
from tests.helpers.thread_comm import ThreadWorld


def test_default_run_prepares_through_the_data_prep_program(tmp_path, monkeypatch):
    """Training never imports data_prep: the default run's shards come from `python -m data_prep
    --quiet`; shards a rival job installed meanwhile count as prepared; a failure is one line."""
    from mpifgl import train
    commands = []

    def rival_installed_first(command, **kwargs):
        commands.append(command)
        (tmp_path / "shards").mkdir()
        (tmp_path / "shards" / "manifest.json").write_text("{}")
        return subprocess.CompletedProcess(command, 2, "", "data_prep: error: output exists\n")

    monkeypatch.setattr(train.subprocess, "run", rival_installed_first)
    config = TrainConfig(dataset="cora", data_root="raw")
    train.prepare_default_shards(config, tmp_path / "shards", 3)
    command = commands[0]
    assert command[1:3] == ["-m", "data_prep"] and "--quiet" in command
    assert command[command.index("--num-clients") + 1] == "3"
    assert command[command.index("--data-root") + 1] == "raw"

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 2, "", "a warning\ndata_prep: error: no\n")

    monkeypatch.setattr(train.subprocess, "run", failing)
    with pytest.raises(ValueError, match=r"preparing the default shards in \S+other failed: no$"):
        train.prepare_default_shards(config, tmp_path / "other", 3)


# -- the program in-process, in one process (centralized) or in threads (ThreadWorld) -------------
CENTRAL = ["--algo", "centralized", "--hidden", "8", "--log-every", "100"]


def test_resume_continues_in_place_or_into_a_new_directory_never_over_a_finished_run(
        program, toy_shards, tmp_path):
    shards, first, second = toy_shards(2), tmp_path / "run a", tmp_path / "run b"
    assert program(*CENTRAL, "--shards", shards, "--out", first, "--epochs", "2",
                   "--checkpoint-every", "1") == (0, [])
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    status, lines = program("--resume", first, "--epochs", "3")
    assert status == 1 and lines == [
        f"mpifgl.train: error: --resume '{first}': the run there is finished (final.json); a "
        f"resume never rewrites a finished run: to train it further, continue it into a new "
        f"directory with --resume '{first}' --out NEW_DIR --epochs N"]
    assert program("--resume", first, "--out", second, "--epochs", "3") == (0, [])
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before  # only read
    assert [json.loads(line)["epoch"]
            for line in (second / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert json.loads((second / "config.json").read_text())["resume"] == str(first)


@pytest.mark.parametrize("history_every", [1, 2])
def test_a_resumed_run_with_history_continues_bit_for_bit(program, toy_shards, tmp_path,
                                                           history_every):
    """--history-every: a checkpoint between refreshes carries the history, one on a refresh
    boundary does not need to (the next step refreshes it); either way the resumed run's
    losses and scores are the uninterrupted run's, bit for bit."""
    shards = toy_shards(2)
    flags = [*CENTRAL, "--shards", shards, "--sampling", "label", "--history-every",
             history_every, "--layers", "3", "--eval-every", "1"]
    straight, first, resumed = tmp_path / "straight", tmp_path / "first", tmp_path / "resumed"
    assert program(*flags, "--out", straight, "--epochs", "3") == (0, [])
    assert program(*flags, "--out", first, "--epochs", "1", "--checkpoint-every", "1") == (0, [])
    assert program("--resume", first, "--out", resumed, "--epochs", "3") == (0, [])

    def epochs(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["epoch"], r["loss"], r.get("test")) for r in rows]

    assert epochs(resumed) == epochs(straight)


def test_a_resumed_secure_run_with_history_continues_bit_for_bit(toy_shards, tmp_path):
    """3 clients in threads, --secure --history-every 3, a checkpoint at epoch 4 (between two
    refreshes): the resumed run's losses, scores and weights are the uninterrupted run's, bit
    for bit. The checkpoint carries every client's history and every slot's fixed-point range
    (without the ranges the sums round differently after the resume)."""
    import torch
    flags = ["--shards", toy_shards(3), "--hidden", "16", "--sample-size", "30", "--seed", "4",
             "--secure", "--history-every", "3", "--checkpoint-every", "2", "--log-every", "100"]
    whole, part, more = tmp_path / "whole", tmp_path / "part", tmp_path / "more"
    assert threaded_program([*flags, "--out", whole, "--epochs", "6"], 4) == [0] * 4
    assert threaded_program([*flags, "--out", part, "--epochs", "4"], 4) == [0] * 4
    assert threaded_program(["--resume", part, "--out", more, "--epochs", "6"], 4) == [0] * 4

    def epochs(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["epoch"], r["loss"], r["val_micro_f1"], r["test_micro_f1"]) for r in rows]

    assert epochs(more) == epochs(whole)
    first, second = torch.load(more / "model.pt"), torch.load(whole / "model.pt")
    assert all(torch.equal(first[k], second[k]) for k in second)
    # the resumed run's record counts both parts: the uninterrupted run's bytes and epochs
    totals = [{key: json.loads((run / "final.json").read_text())[key]
               for key in ("epochs_run", "evaluations", "bytes_per_rank")} for run in (more, whole)]
    assert totals[0] == totals[1] and totals[1]["epochs_run"] == 6


def test_a_run_stopped_before_its_first_checkpoint_says_how_to_start_again(
        program, toy_shards, tmp_path):
    run = tmp_path / "my run"
    assert program(*CENTRAL, "--shards", toy_shards(2), "--out", run, "--epochs", "2",
                   "--checkpoint-every", "5")[0] == 0
    for name in ("final.json", "model.pt"):  # as if killed before its first checkpoint
        (run / name).unlink()
    (run / ".checkpoint.pt.k2j3.tmp").write_bytes(b"half a checkpoint")
    (run / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid()}))
    status, lines = program("--resume", run)
    assert status == 1 and len(lines) == 1
    assert lines[0].startswith(f"mpifgl.train: error: --resume '{run}': the run there stopped "
                               f"before its first checkpoint (written after epoch 5), so there "
                               f"is nothing to resume; start it again with: python -m "
                               f"mpifgl.train --shards ")
    assert lines[0].endswith(f"--checkpoint-every 5 --log-every 100 --out '{run}' --force")
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl"]


def test_a_non_finite_loss_ends_the_run_without_a_result(program, toy_shards, tmp_path):
    """--lr 1e30 makes the weights overflow in the second epoch: one line naming the quantity,
    epoch and step, exit 1, no final.json or model.pt, the first epoch's checkpoint kept."""
    run = tmp_path / "run"
    status, lines = program(*CENTRAL, "--shards", toy_shards(2), "--out", run, "--epochs", "5",
                            "--lr", "1e30", "--checkpoint-every", "1")
    assert status == 1 and len(lines) == 1, lines
    assert re.match(r"mpifgl\.train: error: non-finite (local loss|local gradient of \S+) "
                    r"\(\S+\) in epoch 2, step 1 of 1; files kept in \S+, its checkpoint of "
                    r"epoch 1 too; the same settings repeat the same steps", lines[0]), lines[0]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.json",
                                                     "metrics.jsonl"]
    assert [json.loads(line)["epoch"]
            for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_sample_larger_than_the_graph_is_refused_before_anything_is_written(
        program, toy_shards, tmp_path):
    status, lines = program("--algo", "centralized", "--sampling", "label", "--shards",
                            toy_shards(2), "--out", tmp_path / "run", "--sample-size", "61")
    assert status == 1 and lines == [
        f"mpifgl.train: error: --sample-size is 61, expected at most 60 (the nodes of the shards "
        f"in {toy_shards(2)}), or 0 for the default by the graph's size (15)"]
    assert not (tmp_path / "run").exists()


def test_resume_refuses_shards_made_again_with_another_seed(program, toy_graph, tmp_path):
    shards, run = tmp_path / "shards", tmp_path / "run"
    write_shards(toy_graph, random_parts(60, 2, seed=0), shards)
    assert program(*CENTRAL, "--shards", shards, "--out", run, "--epochs", "3",
                   "--checkpoint-every", "1")[0] == 0
    (run / "final.json").unlink()
    write_shards(toy_graph, random_parts(60, 2, seed=1), shards)  # the same path, another seed
    status, lines = program("--resume", run)
    assert status == 1 and len(lines) == 1
    assert re.match(rf"mpifgl\.train: error: --resume {run}: its checkpoint was trained on other "
                    rf"shards \(fingerprint [0-9a-f]{{16}}: toy, test partition seed 0, 2 "
                    rf"clients, 60 nodes\) than {shards} holds now \(fingerprint [0-9a-f]{{16}}",
                    lines[0]), lines[0]


@pytest.mark.parametrize("algo,exchange", [("ours", "reduce"), ("fedavg", "compact")])
def test_a_client_file_of_another_partition_is_reported_once_whatever_the_method(
        toy_graph, tmp_path, capsys, algo, exchange):
    """Three clients in threads (ThreadWorld): the set-up sum shows that client_1.h5 belongs to
    another partition; every rank stops there, rank 0 prints one line, no run directory stays."""
    from mpifgl import train
    shards = write_shards(toy_graph, random_parts(60, 3, seed=0), tmp_path / "shards")
    other = write_shards(toy_graph, random_parts(60, 3, seed=1), tmp_path / "other")
    tamper_shard(shards, 1, source=other / "client_1.h5")
    config = TrainConfig(algo=algo, exchange=exchange, shards=str(shards),
                         out=str(tmp_path / "run"), epochs=1, hidden=8)

    def body(comm):
        progress = train.RankProgress(config)
        return train.run_rank(comm, progress, lambda: train.train(config, comm, progress, set()))

    assert ThreadWorld(4).run(body) == [1, 1, 1, 1]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"mpifgl.train: error: {shards}: the shards are not one partition of one graph: the "
        f"clients' global node ids do not cover 0..59 exactly once")
    assert "client_1.h5 disagrees with every shard it shares edges with" in lines[0]
    assert not (tmp_path / "run").exists()


# -- a run's record: its checkpoints are its own, loading one runs no code, its totals are true --
def checkpointed_run(program, shards, run, epochs: int = 2) -> dict:
    """A finished centralized run with a checkpoint every epoch; its config.json."""
    assert program(*CENTRAL, "--shards", shards, "--out", run, "--epochs", epochs,
                   "--checkpoint-every", "1") == (0, [])
    return json.loads((run / "config.json").read_text())


class RunsCode:
    """Unpickling it would create ``marker`` (what a hostile checkpoint would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_is_refused_without_running_its_code(program, toy_shards,
                                                                   tmp_path):
    import torch
    run, marker = tmp_path / "run", tmp_path / "MARKER"
    checkpointed_run(program, toy_shards(2), run)
    genuine = torch.load(run / "checkpoint.pt", weights_only=True)  # what a real one holds
    torch.save({**genuine, "model": RunsCode(marker)}, run / "checkpoint.pt")
    status, lines = program("--resume", run, "--out", tmp_path / "new")
    assert status == 1 and lines == [
        f"mpifgl.train: error: {run}/checkpoint.pt: refused: it holds the Python object "
        f"io.open, which only running code could rebuild; a checkpoint of mpifgl.train "
        f"holds tensors, numbers, strings, lists and dicts only, so this file was not written "
        f"by it (or was altered)"]
    assert not marker.exists() and not (tmp_path / "new").exists()
    torch.load(run / "checkpoint.pt", weights_only=False)  # what the old loader did: it runs
    assert marker.exists()


def test_a_checkpoint_copied_from_another_run_is_refused_naming_both(program, toy_shards,
                                                                     tmp_path):
    shards, mine, other = toy_shards(2), tmp_path / "mine", tmp_path / "other"
    own_id = checkpointed_run(program, shards, mine)["run_id"]
    other_id = checkpointed_run(program, shards, other)["run_id"]
    assert own_id != other_id
    (mine / "checkpoint.pt").write_bytes((other / "checkpoint.pt").read_bytes())
    status, lines = program("--resume", mine, "--out", tmp_path / "new", "--epochs", "3")
    assert status == 1 and lines == [
        f"mpifgl.train: error: --resume {mine}: {mine}/checkpoint.pt belongs to another run "
        f"(run id {other_id}, written in {other}) than the run of {mine} (run id {own_id}, its "
        f"config.json); a checkpoint copied from another run is not resumed: resume that run "
        f"(--resume {other})"]
    assert not (tmp_path / "new").exists()


def test_a_resume_never_ends_before_its_checkpoint(program, toy_shards, tmp_path):
    run = tmp_path / "run"
    checkpointed_run(program, toy_shards(2), run, epochs=3)
    status, lines = program("--resume", run, "--out", tmp_path / "new", "--epochs", "2")
    assert status == 1 and lines == [
        f"mpifgl.train: error: --epochs is 2, expected at least 3: the checkpoint in {run} is "
        f"of epoch 3 and a resume trains on from there (--epochs 3 writes the final files of "
        f"that model without training further)"]
    assert not (tmp_path / "new").exists()


def test_a_resumed_runs_record_covers_the_whole_run(program, toy_shards, tmp_path):
    """final.json of a resumed run: totals of both parts, each part said apart, where it
    continued from; its config.json a run id of its own; the summary line says so."""
    from mpifgl.train import summary_line
    first, second = tmp_path / "first", tmp_path / "second"
    first_id = checkpointed_run(program, toy_shards(2), first)["run_id"]
    assert program("--resume", first, "--out", second, "--epochs", "5") == (0, [])
    before = json.loads((first / "final.json").read_text())
    final = json.loads((second / "final.json").read_text())
    second_id = json.loads((second / "config.json").read_text())["run_id"]
    assert second_id not in (None, first_id) and final["run_id"] == second_id
    assert final["resumed_from"] == {"run_id": first_id, "epoch": 2, "path": str(first)}
    assert [(p["run_id"], p["run_dir"], p["first_epoch"], p["last_epoch"], p["epochs_run"],
             p["evaluations"]) for p in final["parts"]] == [
        (first_id, str(first), 1, 2, 2, 2), (second_id, str(second), 3, 5, 3, 3)]
    assert (final["epochs_run"], final["evaluations"]) == (5, 5)
    for total in ("wall_seconds", "train_seconds", "eval_seconds"):
        assert final[total] == pytest.approx(sum(p[total] for p in final["parts"]))
    assert final["parts"][0]["wall_seconds"] <= before["wall_seconds"]
    assert f"(resumed from the checkpoint of epoch 2 in {first}; this part 3 epochs in " \
        in summary_line(final, str(second))


def test_moved_shards_are_resumed_when_their_fingerprint_matches(program, toy_shards,
                                                                 tmp_path):
    shards, run, moved = toy_shards(2), tmp_path / "run", tmp_path / "moved"
    checkpointed_run(program, shards, run)
    shards.rename(moved)
    status, lines = program("--resume", run, "--out", tmp_path / "new", "--epochs", "3")
    assert status == 1 and lines == [
        f"mpifgl.train: error: shard directory {shards} does not exist (expected the --out of "
        f"`python -m data_prep`); if the shards were moved, give their new place with --resume "
        f"{run} --shards NEW_PATH (their fingerprint proves them the same)"]
    assert program("--resume", run, "--out", tmp_path / "new", "--epochs", "3",
                   "--shards", moved) == (0, [])
    assert json.loads((tmp_path / "new" / "config.json").read_text())["shards"] == str(moved)


def test_a_manifest_that_contradicts_its_shards_is_refused_at_set_up_as_verify_does(
        program, tmp_path, capsys):
    """data_prep's shards with the manifest edited (checksums consistent): 12 classes claimed
    for 4, then one client's class histogram. Training refuses both at set-up with the words of
    `data_prep verify`, before any run directory exists."""
    from data_prep.__main__ import main as data_prep
    from data_prep.verify import verify_shard_dir
    from tests.helpers.data_prep_fixtures import SMALL_SYN
    shards = tmp_path / "shards"
    assert data_prep([*SMALL_SYN, "--num-clients", "2", "--out", str(shards), "--quiet"]) == 0
    manifest_path = shards / "manifest.json"
    pristine = json.loads(manifest_path.read_text())
    edits = [({**pristine, "num_classes": 12},
              "num_classes is 12 but clients[0].class_counts lists 4 classes"),
             ({**pristine, "clients": [{**pristine["clients"][0], "class_counts": [
                 c + 1 for c in pristine["clients"][0]["class_counts"]]},
                 pristine["clients"][1]]}, "class_counts is [")]
    for manifest, words in edits:
        manifest_path.write_text(json.dumps(manifest))
        status, lines = program(*CENTRAL, "--shards", shards, "--out", tmp_path / "run")
        assert status == 1 and len(lines) == 1 and words in lines[0], lines
        assert lines[0].startswith(f"mpifgl.train: error: {shards}/")
        assert any(words in problem for problem in verify_shard_dir(shards).problems)
        assert not (tmp_path / "run").exists()


def test_a_run_never_writes_into_its_shards(program, toy_shards):
    shards = toy_shards(2)
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    for out, why in ((shards, "it is a shard directory of data_prep (manifest.json there)"),
                     (shards / "run", f"it lies inside the shard directory {shards}")):
        status, lines = program(*CENTRAL, "--shards", shards, "--out", out)
        assert status == 1 and len(lines) == 1
        assert lines[0].startswith(f"mpifgl.train: error: --out {out}: {why}"), lines
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before


def _allocate_too_much(*args, **kwargs):
    """A real allocation failure: far more than any address space holds."""
    import torch
    torch.empty(1 << 50)


MEMORY_PHASES = [  # where memory runs out, what the line says where
    ("mpifgl.trainer.GNN", "during set-up"),
    ("mpifgl.trainer.Trainer.train_step", "in epoch 1 of 2, step 1 of 1"),
    ("mpifgl.trainer.Trainer.evaluate", "in epoch 1 of 2, evaluating"),
    ("mpifgl.trainer.Trainer.save_checkpoint", "while writing the checkpoint of epoch 1"),
    ("mpifgl.trainer.Trainer.finish", "while writing the final outputs"),
]


@pytest.mark.parametrize("target,where", MEMORY_PHASES, ids=[w for _, w in MEMORY_PHASES])
def test_running_out_of_memory_in_any_phase_is_one_line_with_what_to_change(
        program, toy_shards, tmp_path, monkeypatch, target, where):
    monkeypatch.setattr(target, _allocate_too_much)
    status, lines = program(*CENTRAL, "--shards", toy_shards(2), "--out", tmp_path / "run",
                            "--epochs", "2", "--checkpoint-every", "1")
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"mpifgl.train: error {where}: out of memory allocating 4.0 PiB"
                               ), lines[0]
    assert "; use a smaller --hidden (now 8), or more memory for this process" in lines[0]
    assert (tmp_path / "run").exists() == (where != "during set-up")  # a run that never started


def test_the_placement_names_the_hosts_only_when_there_are_several():
    import torch
    from mpifgl.hardware import Placement
    from mpifgl.train import describe_placements, rank_ranges
    cpu = torch.device("cpu")
    spread = [Placement(cpu, 1, host=h) for h in ["node1"] * 5 + ["node2"] * 3 + ["node1"]]
    assert describe_placements(spread) == ("cpu x 9, 1 thread per rank on 2 hosts (node1: ranks "
                                           "0-4,8, node2: ranks 5-7)")
    together = [Placement(cpu, 2, host="vm"), Placement(cpu, 1, host="vm")]
    assert describe_placements(together) == "cpu x 2, 1/2 threads per rank"
    assert rank_ranges([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7" and rank_ranges([3]) == "3"


def test_ours_on_louvain_shards_warns_once_unless_the_sampler_was_chosen(toy_graph, tmp_path,
                                                                         caplog):
    """Three clients in threads on Louvain shards: the server warns once that the label-guided
    sampler may lose accuracy on communities; --sampling label given silences it, fedavg (no
    sampler) never hears it."""
    import logging
    from data_prep.api import write_shards as prepare
    graph = {"edge_index": np.vstack(toy_graph.adj.nonzero()), "x": toy_graph.x,
             "y": toy_graph.y, "train_mask": toy_graph.train_mask,
             "val_mask": toy_graph.val_mask, "test_mask": toy_graph.test_mask}
    shards = tmp_path / "louvain"
    assert prepare(graph, 3, "louvain", shards, seed=0)["partition"] == "louvain"
    for extra, algo, warned in (([], "ours", 1), (["--sampling", "label"], "ours", 0),
                                ([], "fedavg", 0)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert threaded_program(["--algo", algo, "--shards", shards, "--epochs", "1",
                                     "--hidden", "8", "--out", tmp_path / f"{algo}{len(extra)}",
                                     *extra], 4) == [0, 0, 0, 0]
        notes = [r for r in caplog.records if "partition is louvain" in r.getMessage()]
        assert len(notes) == warned, (algo, extra)
