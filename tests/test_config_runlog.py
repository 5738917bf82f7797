"""Plain pytest: configuration parsing/validation and the run directory's safety rules."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fgl_common.cli import explicit_dests
from mpifgl.config import TrainConfig, build_parser, parse_config, resumed_config
from mpifgl.methods import get_method
from mpifgl.runlog import RunDirError, RunDirectory, atomic_write, claim_run_dir


def test_defaults_are_the_papers_settings():
    config = parse_config([])
    assert (config.hidden, config.dropout, config.layers, config.epochs) == (128, 0.2, 2, 200)
    assert config.sampling == "label" and config.algo == "ours" and config.backbone == "gcn"
    config.validate()


@pytest.mark.parametrize("flag,value,message", [
    ("layers", 0, "--layers is 0, expected an integer >= 1"),
    ("dropout", 1.0, "--dropout is 1.0, expected a probability in [0, 1)"),
    ("lr", -0.1, "--lr is -0.1"),
    ("sample_size", -5, "--sample-size is -5"),
    ("steps_per_epoch", -1, "--steps-per-epoch is -1"),
    ("seed", -1, "--seed is -1, expected an integer >= 0"),
    ("fanouts", "25,x", "--fanouts is '25,x'"),
    ("boundary_p", 0.0, "--boundary-p is 0.0"),
])
def test_validation_names_flag_value_and_expectation(flag, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        TrainConfig(**{flag: value}).validate()


def test_help_lists_every_flag():
    text = build_parser().format_help()
    assert "--sample-size" in text and "10%" in text and "--nc-fraction" in text


def test_every_field_has_exactly_one_flag():
    parser = build_parser()
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings[0] != "-h"]
    assert len(flags) == len(set(flags)) == len(TrainConfig.__dataclass_fields__)


def test_explicit_flags_and_resume_overrides():
    given_flags = explicit_dests(build_parser(), ["--epochs", "5", "--save-logits"])
    assert given_flags == {"epochs", "save_logits"}
    saved = TrainConfig(lr=0.1, epochs=10).to_dict()
    given = parse_config(["--resume", "r", "--epochs", "20"])
    resumed = resumed_config(saved, given, {"resume", "epochs"})
    assert resumed.epochs == 20 and resumed.lr == 0.1 and resumed.out == "r"
    with pytest.raises(ValueError, match="--lr 0.5"):
        resumed_config(saved, parse_config(["--resume", "r", "--lr", "0.5"]), {"resume", "lr"})


def test_centralized_is_full_batch_unless_sampling_is_asked_for():
    """The centralized reference trains on the whole graph (the paper's centralized GCN); the
    sampler's default (label) applies to ours only."""
    for argv, expected in ((["--algo", "centralized"], "none"),
                           (["--algo", "centralized", "--sampling", "label"], "label"),
                           (["--algo", "ours"], "label"), ([], "label")):
        config = parse_config(argv)
        explicit = explicit_dests(build_parser(), argv)
        config = get_method(config.algo).with_defaults(config, explicit)
        assert config.sampling == expected, argv


def test_atomic_write_keeps_the_previous_file_on_failure(tmp_path):
    run = RunDirectory(tmp_path)
    run.save_torch("checkpoint.pt", {"epoch": 1})

    def crash(tmp):
        with open(tmp, "wb") as handle:
            handle.write(b"half a checkpoint")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "checkpoint.pt", crash)
    assert torch.load(tmp_path / "checkpoint.pt") == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temp left


def test_run_dir_rules(tmp_path):
    claim_run_dir(tmp_path / "new", force=False, resume=False).release()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "final.json").write_text("{}")
    with pytest.raises(RunDirError, match="already holds a run"):
        claim_run_dir(tmp_path / "old", False, False)
    claim_run_dir(tmp_path / "old", True, False).release()
    with pytest.raises(RunDirError, match="no checkpoint.pt"):
        claim_run_dir(tmp_path / "old", False, True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        claim_run_dir(tmp_path / "file", False, False)


def test_metrics_truncated_to_checkpoint_epoch(tmp_path):
    run = RunDirectory(tmp_path)
    for epoch in range(1, 6):
        run.append_metrics({"epoch": epoch, "loss": 1.0 / epoch})
    run.reset_metrics(keep_through_epoch=3)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


def test_model_module_does_not_import_mpi():
    code = ("import sys, mpifgl.model, mpifgl.graph, mpifgl.sampling, mpifgl.trainer, "
            "fgl_common.shard_format; assert 'mpi4py' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_only_comm_imports_mpi4py():
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    offenders = [str(path.relative_to(repo)) for folder in ("mpifgl", "data_prep")
                 for path in (repo / folder).rglob("*.py")
                 if path.name != "comm.py" and ("from mpi4py" in path.read_text()
                                                or "import mpi4py" in path.read_text())]
    assert offenders == []


def test_init_seed_fixes_only_the_initial_weights():
    from mpifgl.model import GNN
    same = TrainConfig(seed=0), TrainConfig(seed=1, init_seed=0)
    other = TrainConfig(seed=1)
    assert [c.weight_seed for c in (*same, other)] == [0, 0, 1]
    models = [GNN("gcn", 5, 4, 3, 2, 0.2, c.weight_seed) for c in (*same, other)]
    first, second, third = (m.state_dict() for m in models)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], third[k]) for k in first)
    with pytest.raises(ValueError, match="--init-seed is -2"):
        TrainConfig(init_seed=-2).validate()
