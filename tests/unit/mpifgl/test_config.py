"""mpifgl.config: defaults, validation naming the flag, one flag per field, resume rules."""
from __future__ import annotations

import pytest
import torch

from fgl_common.cli import explicit_dests
from mpifgl.config import TrainConfig, build_parser, parse_config, resumed_config
from mpifgl.methods import get_method


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
    ("fanouts", (25, 0), "--fanouts is '25,0', expected comma-separated integers >= 1"),
    ("fanouts", (), "--fanouts is '', expected comma-separated integers >= 1"),
    ("boundary_p", 0.0, "--boundary-p is 0.0"),
])
def test_validation_names_flag_value_and_expectation(flag, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        TrainConfig(**{flag: value}).validate()


def test_fanouts_parse_from_the_command_line_and_from_saved_configs(capsys):
    assert parse_config(["--fanouts", "5,3,2"]).fanouts == (5, 3, 2)
    assert parse_config([]).fanouts == (25, 10)
    with pytest.raises(SystemExit):
        parse_config(["--fanouts", "25,x"])
    assert "argument --fanouts: invalid comma-separated int value: '25,x'" in \
        capsys.readouterr().err
    # config.json holds a list; a checkpoint written before the flag was typed, its text
    for saved in ([4, 3], "4,3"):
        assert TrainConfig.from_dict({"fanouts": saved, "epochs": 3}).fanouts == (4, 3)


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


def test_epochs_zero_is_refused():
    with pytest.raises(ValueError, match=r"--epochs is 0, expected an integer >= 1"):
        TrainConfig(epochs=0).validate()


def test_resume_compares_resolved_shard_paths(tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    shards.mkdir()
    saved = TrainConfig(shards=str(shards), epochs=4).to_dict()
    monkeypatch.chdir(tmp_path)
    for spelling in ("shards", "./shards/", str(shards)):
        given = parse_config(["--resume", "r", "--shards", spelling])
        assert resumed_config(saved, given, {"resume", "shards"}).shards == str(shards)
    with pytest.raises(ValueError, match="--shards"):
        resumed_config(saved, parse_config(["--resume", "r", "--shards", "other"]),
                       {"resume", "shards"})


