"""mpifgl.train in-process: the default run prepares its shards through the data_prep program
(its subprocess replaced here; tests/e2e/test_train.py runs it for real); the program's rules in
one process or in threads: resume, a run stopped before its first checkpoint, a non-finite loss,
an out-of-range sample size, shards that are not who they say they are."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess

import pytest

from mpifgl.config import TrainConfig
from tests.helpers import dead_pid
from tests.helpers.graphs import random_parts, tamper_shard, write_shards
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
@pytest.fixture
def program(monkeypatch, capsys):
    """``python -m mpifgl.train ARGS`` in this process: (exit status, its stderr lines). The
    signal handlers it installs are put back afterwards."""
    from mpifgl import train
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def run(*argv) -> tuple[int, list[str]]:
        capsys.readouterr()
        status = train.main([str(a) for a in argv])
        return status, capsys.readouterr().err.strip().splitlines()

    yield run
    for signum, handler in saved.items():
        signal.signal(signum, handler)


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


def threaded_program(argv: list, ranks: int) -> list[int]:
    """``mpirun -n RANKS python -m mpifgl.train ARGV`` with the ranks as threads: every rank's
    exit status."""
    from mpifgl import train
    from mpifgl.methods import get_method
    argv = [str(a) for a in argv]
    config = train.parse_args(argv, quiet=True)
    explicit = train.explicit_dests(train.build_parser(), argv)
    config = config.replace(**get_method(config.algo).default_changes(explicit))

    def body(comm):
        progress = train.RankProgress(config)
        return train.run_rank(comm, progress, lambda: train.train(config, comm, progress,
                                                                  explicit))

    return ThreadWorld(ranks).run(body)


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
