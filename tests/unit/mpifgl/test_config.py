"""mpifgl.config: defaults, validation naming the flag, one flag per field, resume rules, the
command that starts a run again, the help's default run name."""
from __future__ import annotations

import re

import pytest
import torch

from fgl_common.cli import explicit_dests
from mpifgl.config import (TrainConfig, build_parser, parse_config, restart_command,
                           resumed_config)
from mpifgl.methods import get_method
from mpifgl.runlog import default_run_dir


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
    ("saint_coverage", -1.0, "--saint-coverage is -1.0, expected a number >= 0"),
    ("wire_dtype", "int8", "--wire-dtype is 'int8', expected one of same, bfloat16, float16"),
    ("llcg_local_steps", 0, "--llcg-local-steps is 0, expected an integer >= 1"),
    ("llcg_server_steps", -1, "--llcg-server-steps is -1, expected an integer >= 0"),
    ("llcg_server_lr", 0.0, "--llcg-server-lr is 0.0, expected a positive number"),
    ("llcg_server_batch_size", -2, "--llcg-server-batch-size is -2, expected an integer >= 1, "
                                   "or 0 for --batch-size"),
    ("llcg_rho", 0.9, "--llcg-rho is 0.9, expected a number >= 1"),
    ("llcg_seeds", "val", "--llcg-seeds is 'val', expected one of all, train"),
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
        config = config.replace(**get_method(config.algo).default_changes(explicit, config.layers))
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
    # shards elsewhere are taken here; mpifgl.train proves them the same by their fingerprint
    moved = resumed_config(saved, parse_config(["--resume", "r", "--shards", "other"]),
                           {"resume", "shards"})
    assert moved.shards == str(tmp_path / "other")
    with pytest.raises(ValueError, match=r"these flags differ: --lr 0\.5 \(run has 0\.01\)"):
        resumed_config(saved, parse_config(["--resume", "r", "--lr", "0.5"]), {"resume", "lr"})


def test_a_resume_never_ends_before_its_checkpoints_epoch():
    saved = TrainConfig(epochs=40).to_dict()
    given = parse_config(["--resume", "r", "--epochs", "10"])
    with pytest.raises(ValueError) as refused:
        resumed_config(saved, given, {"resume", "epochs"}, checkpoint_epoch=30)
    assert str(refused.value) == (
        "--epochs is 10, expected at least 30: the checkpoint in r is of epoch 30 and a resume "
        "trains on from there (--epochs 30 writes the final files of that model without "
        "training further)")
    assert resumed_config(saved, parse_config(["--resume", "r", "--epochs", "30"]),
                          {"resume", "epochs"}, checkpoint_epoch=30).epochs == 30
    assert resumed_config(saved, parse_config(["--resume", "r"]), {"resume"},
                          checkpoint_epoch=30).epochs == 40




@pytest.mark.parametrize("argv", [["--lr", "nan"], ["--lr", "inf"], ["--nc-fraction", "nan"],
                                  ["--exchange-buffer-mb", "inf"], ["--weight-decay", "nan"]])
def test_every_float_flag_must_be_a_finite_number(argv, capsys):
    with pytest.raises(SystemExit):
        parse_config(argv)
    assert f"argument {argv[0]}: '{argv[1]}' is not a finite number" in capsys.readouterr().err
    field = argv[0][2:].replace("-", "_")
    with pytest.raises(ValueError, match=f"{argv[0]} is {float(argv[1])!r}, expected a finite"):
        TrainConfig(**{field: float(argv[1])}).validate()  # a config from JSON: the same rule


def test_resume_into_a_new_directory_or_in_place():
    saved = TrainConfig(lr=0.1, epochs=10, out="/runs/x").to_dict()
    in_place = resumed_config(saved, parse_config(["--resume", "/runs/x", "--force"]),
                              {"resume", "force"})
    assert in_place.out == "/runs/x" and not in_place.force  # never overwrites its own run
    into = resumed_config(saved, parse_config(["--resume", "/runs/x", "--out", "/runs/y",
                                               "--force", "--epochs", "20"]),
                          {"resume", "out", "force", "epochs"})
    assert (into.out, into.resume, into.force, into.epochs) == ("/runs/y", "/runs/x", True, 20)


def test_restart_command_is_quoted_and_names_what_differs():
    config = TrainConfig(shards="/data/my shards", epochs=3, secure=True, fanouts=(5, 3))
    assert restart_command(config, 5, "/runs/a b") == (
        "mpirun -n 5 python -m mpifgl.train --shards '/data/my shards' --epochs 3 --secure "
        "--fanouts 5,3 --out '/runs/a b' --force")
    assert restart_command(TrainConfig(algo="centralized"), 1, "r") == (
        "python -m mpifgl.train --algo centralized --dataset cora --out r --force")


def test_help_shows_the_real_default_run_directory_name():
    text = next(a.help for a in build_parser()._actions if "--out" in a.option_strings)
    example = re.search(r"e\.g\. (runs/\S+?)\)", text).group(1)
    real = str(default_run_dir("cora", "ours"))
    pattern = r"runs/cora-ours-\d{8}-\d{6}\.\d{6}-(p\d+|j\d+(_\d+)?)$"
    assert re.match(pattern, example) and re.match(pattern, real), (example, real)
    assert "runs/<dataset>-<algo>-<date>-<time>.<microseconds>-" in text


def test_a_16_bit_wire_needs_the_compact_exchange_and_no_masking():
    TrainConfig(wire_dtype="bfloat16").validate()
    for other in ({"exchange": "reduce"}, {"secure": True}):
        with pytest.raises(ValueError, match="--wire-dtype float16 with --(exchange reduce|"
                                             "secure): expected --exchange one of compact "
                                             "without --secure"):
            TrainConfig(wire_dtype="float16", **other).validate()


def test_config_rejects_a_buffer_cap_that_is_not_positive():
    with pytest.raises(ValueError, match="--exchange-buffer-mb is 0.0, expected a positive"):
        TrainConfig(exchange_buffer_mb=0.0).validate()
    assert TrainConfig().exchange == "compact"


def test_llcg_takes_the_references_batch_and_ten_neighbours_at_every_layer(capsys):
    from mpifgl import train
    for argv, fanouts in ((["--algo", "llcg"], (10, 10)),
                          (["--algo", "llcg", "--layers", "3"], (10, 10, 10)),
                          (["--algo", "llcg", "--layers", "3", "--fanouts", "5,5,5"], (5, 5, 5))):
        config = train.parse_args(argv, quiet=True)
        explicit = explicit_dests(build_parser(), argv)
        config = config.replace(**get_method("llcg").default_changes(explicit, config.layers))
        assert (config.batch_size, config.fanouts) == (256, fanouts), argv  # the method's
    # a value given of another length: exit 2 and one line, before anything starts
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--algo", "llcg", "--layers", "3", "--fanouts", "10,10"], quiet=False)
    assert stop.value.code == 2
    assert "error: --fanouts is '10,10', expected one value per layer with --algo llcg " \
           "(--layers 3: e.g. 10,10,10)" in capsys.readouterr().err


def test_graphsage_fan_outs_follow_the_depth_and_a_given_one_must_match_it(capsys):
    """GraphSAGE's paper samples 25,10 at 2 layers, OGB's products example 15,10,5 at 3; before
    the default followed --layers, `--algo graphsage --layers 3` ended at set-up."""
    from mpifgl import train
    for layers, fanouts in ((1, (25,)), (2, (25, 10)), (3, (15, 10, 5)), (4, (15, 10, 5, 5))):
        argv = ["--algo", "graphsage", "--layers", str(layers)]
        config = train.parse_args(argv, quiet=True)
        config = config.replace(**get_method("graphsage").default_changes(
            explicit_dests(build_parser(), argv), config.layers))
        config.validate()
        assert config.fanouts == fanouts
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--algo", "graphsage", "--layers", "3", "--fanouts", "25,10"],
                         quiet=False)
    assert stop.value.code == 2
    assert "error: --fanouts is '25,10', expected one value per layer with --algo graphsage " \
           "(--layers 3: e.g. 15,10,5)" in capsys.readouterr().err
    assert get_method("ours").default_changes(set(), 3) == {}  # ours samples no fan-out


def test_llcg_rejects_a_rho_that_is_not_a_number():
    from mpifgl import train
    with pytest.raises(SystemExit):
        train.parse_args(["--algo", "llcg", "--llcg-rho", "nan"], quiet=True)
