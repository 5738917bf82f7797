"""mpifgl.trainer in one process (LocalComm): steps reduce the loss, a run writes its outputs,
and a checkpoint round trip restores a trainer that continues bit for bit."""
from __future__ import annotations

import json

import numpy as np
import torch

from fgl_common.shard_format import load_client_shard, read_manifest, shard_filename
from mpifgl.communicator import LocalComm
from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods import build_trainer
from mpifgl.runlog import RunDirectory, load_checkpoint
from mpifgl.trainer import Trainer


def make_trainer(shard_dir, run_dir=None, **flags) -> Trainer:
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.merged([load_client_shard(shard_dir / shard_filename(i))
                                for i in range(manifest.num_clients)])
    config = TrainConfig(algo="centralized", hidden=8, lr=0.05, dropout=0.3, seed=1,
                         sampling="label", **flags)
    return build_trainer(config, LocalComm(), graph, manifest.num_classes,
                         RunDirectory(run_dir) if run_dir else None)


def test_a_few_steps_reduce_the_loss(toy_shards):
    trainer = make_trainer(toy_shards(2))
    losses = [trainer.train_step() for _ in range(30)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses


def test_run_writes_metrics_model_and_final_scores(toy_shards, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    trainer = make_trainer(toy_shards(2), run, epochs=3, save_logits=True)
    final = trainer.run()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[-1]["bytes_sent"] == [0]  # one process: nothing communicated
    assert 0.0 <= final["test_micro_f1"] <= 1.0 and final["epochs"] == 3
    # the run's summary: times, bytes and memory per rank, the best epoch's scores
    assert (final["epochs_run"], final["evaluations"], final["bytes_per_rank"]) == (3, 3, [0])
    assert final["wall_seconds"] >= final["eval_seconds"] > 0
    assert final["mean_train_epoch_seconds"] > 0 and len(final["peak_rss_mb_per_rank"]) == 1
    best = records[final["best_epoch"] - 1]
    assert (final["best_train_micro_f1"], final["test_micro_f1"]) == (best["train_micro_f1"],
                                                                      best["test_micro_f1"])
    assert json.loads((run / "final.json").read_text()) == final
    assert np.load(run / "logits.npy").shape == (60, 3)
    assert set(torch.load(run / "model.pt")) == set(trainer.model.state_dict())


def test_checkpoint_round_trip_restores_identical_state(toy_shards, tmp_path):
    shards = toy_shards(2)
    run = tmp_path / "run"
    run.mkdir()
    first = make_trainer(shards, run)
    for _ in range(3):
        first.train_step()
    first.state.epoch = 3
    first.save_checkpoint()
    second = make_trainer(shards)
    second.load_checkpoint(load_checkpoint(run))
    assert second.state.epoch == 3
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[name]), name
    assert (second.setup.sample_rng.bit_generator.state
            == first.setup.sample_rng.bit_generator.state)
    assert (second.setup.dropout_rng.bit_generator.state
            == first.setup.dropout_rng.bit_generator.state)
    # the optimizer's moments came back too: the next steps are the same, bit for bit
    assert [first.train_step() for _ in range(2)] == [second.train_step() for _ in range(2)]
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)


def test_time_to_target_is_recorded_and_survives_a_resume(toy_shards, tmp_path):
    """--target-val-f1: the first evaluated epoch at or above it, with the seconds of training
    and evaluation to it (the metrics' elapsed_seconds then) and the wall since the start; a
    resumed run keeps both clocks and the epoch found before its checkpoint."""
    run = tmp_path / "run"
    run.mkdir()
    trainer = make_trainer(toy_shards(2), run, epochs=6, target_val_f1=0.01,
                           checkpoint_every=3)
    final = trainer.run()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_seconds"] for r in records]
    assert elapsed == sorted(elapsed) and all(r["wall_seconds"] >= r["elapsed_seconds"]
                                              for r in records)
    assert (final["target_val_micro_f1"], final["target_epoch"]) == (0.01, 1)
    assert final["seconds_to_target"] == records[0]["elapsed_seconds"]
    assert final["wall_seconds_to_target"] >= final["seconds_to_target"] > 0
    resumed = make_trainer(toy_shards(2), None, epochs=6, target_val_f1=0.01)
    resumed.load_checkpoint(load_checkpoint(run))
    assert resumed.clock.reached == (1, final["seconds_to_target"],
                                     final["wall_seconds_to_target"])
    assert resumed.clock.elapsed == records[-1]["elapsed_seconds"]  # its last checkpoint
    unreachable = make_trainer(toy_shards(2), None, target_val_f1=1.0)
    unreachable.clock.check_target(1, 0.99)
    assert unreachable.clock.summary(1, {})["target_epoch"] is None
    assert make_trainer(toy_shards(2)).clock.summary(0, {})["target_val_micro_f1"] is None


def test_the_summary_line_names_the_time_to_target():
    from mpifgl.train import target_phrase
    final = {"target_val_micro_f1": 0.8, "target_epoch": 12, "seconds_to_target": 3.42,
             "wall_seconds_to_target": 5.01}
    assert target_phrase(final) == ("; target val micro-F1 0.8000 first reached at epoch 12, "
                                    "3.4 s of training and evaluation (5.0 s wall)")
    assert target_phrase({**final, "target_epoch": None}) == \
        "; target val micro-F1 0.8000 not reached"
    assert target_phrase({"target_val_micro_f1": None}) == ""
