"""Plain pytest: fgl_common.cli, the one dataclass-to-flags mechanism of every entry point."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass
from pathlib import Path

import pytest

from fgl_common.cli import (add_dataclass_arguments, check_finite, dataclass_from_namespace,
                            explicit_dests, flag_name, option)


@dataclass(frozen=True)
class Inner:
    nodes: int = option(100, "number of nodes")
    edges: int | None = option(None, "exact number of edges")


@dataclass(frozen=True)
class Outer:
    name: str = option(MISSING, "what to run", required=True)
    method: str = option("random", "how to split", flag="--partition")
    kind: str = option("a", "a or b, 100% sure", ("a", "b"))
    root: Path | None = option(None, "a folder")
    force: bool = option(False, "replace what is there")
    show_progress: bool = option(True, "print nothing", flag="--quiet")
    inner: Inner = Inner()


def parser_for(formatter: type = argparse.HelpFormatter) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t", formatter_class=formatter)
    add_dataclass_arguments(parser, Outer, exclude=("inner",))
    add_dataclass_arguments(parser, Inner, "in-")
    return parser


def parse(*argv: str) -> Outer:
    args = parser_for().parse_args(list(argv))
    return dataclass_from_namespace(Outer, args, inner=dataclass_from_namespace(Inner, args, "in-"))


def test_defaults_types_and_nested_prefix():
    config = parse("--name", "x")
    assert config == Outer(name="x")
    config = parse("--name", "x", "--partition", "metis", "--root", "/tmp", "--force", "--quiet",
                   "--in-nodes", "7", "--in-edges", "3")
    assert config == Outer(name="x", method="metis", root=Path("/tmp"), force=True,
                           show_progress=False, inner=Inner(nodes=7, edges=3))
    assert isinstance(config.inner.nodes, int) and isinstance(config.root, Path)


def test_required_flag_and_choices_are_argparse_errors(capsys):
    with pytest.raises(SystemExit):
        parse()
    assert "--name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--name", "x", "--kind", "c")
    assert "invalid choice: 'c'" in capsys.readouterr().err


def test_help_names_each_default_once_under_either_formatter():
    for formatter in (argparse.HelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        text = " ".join(parser_for(formatter).format_help().split())
        assert text.count("(default: 100)") == 1 and "100% sure" in text
        assert "--partition PARTITION" in text and "--quiet" in text
    plain = " ".join(parser_for().format_help().split())
    assert "exact number of edges (default: None)" not in plain  # None: nothing to show


def test_a_bool_defaulting_to_true_needs_a_flag_that_says_what_turns_it_off():
    @dataclass
    class Bad:
        verbose: bool = option(True, "talk")

    with pytest.raises(TypeError, match="Bad.verbose"):
        add_dataclass_arguments(argparse.ArgumentParser(), Bad)


def test_only_and_exclude_pick_fields():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Outer, only=("name", "force"))
    flags = {a.option_strings[0] for a in parser._actions} - {"-h"}
    assert flags == {"--name", "--force"}
    assert flag_name("num_clients", "syn-") == "--syn-num-clients"


def test_explicit_dests_are_the_flags_given():
    parser = parser_for()
    assert explicit_dests(parser, ["--name", "x", "--quiet", "--in-nodes=5"]) == \
        {"name", "show_progress", "in_nodes"}
    assert explicit_dests(parser, []) == set()


@dataclass(frozen=True)
class Lists:
    run_dir: Path = option(MISSING, "the run", positional=True)
    clients: tuple[int, ...] = option((4, 8), "client counts")
    methods: tuple[str, ...] = option(("ours",), "methods", ("ours", "centralized"))
    seeds: tuple[int, ...] | None = option(None, "seeds")
    data_root: str = option("", "raw data; empty: the loader's default")


def parse_lists(*argv: str) -> Lists:
    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_arguments(parser, Lists)
    return dataclass_from_namespace(Lists, parser.parse_args(list(argv)))


def test_positional_field_is_a_required_argument_named_after_it(capsys):
    assert parse_lists("runs/a") == Lists(run_dir=Path("runs/a"))
    with pytest.raises(SystemExit):
        parse_lists()
    assert "RUN_DIR" in capsys.readouterr().err

    @dataclass
    class Defaulted:
        where: str = option("x", "a positional with a default", positional=True)

    with pytest.raises(TypeError, match="Defaulted.where"):
        add_dataclass_arguments(argparse.ArgumentParser(), Defaulted)


def test_tuple_field_is_one_comma_separated_value_of_typed_items():
    config = parse_lists("r", "--clients", "2,3, 5,", "--methods", "centralized,ours",
                         "--seeds", "0,1")
    assert config.clients == (2, 3, 5) and config.methods == ("centralized", "ours")
    assert config.seeds == (0, 1)
    assert parse_lists("r") == Lists(run_dir=Path("r"), clients=(4, 8), methods=("ours",))
    assert parse_lists("r", "--clients", "").clients == ()
    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_arguments(parser, Lists)
    text = " ".join(parser.format_help().split())
    assert "(default: 4,8)" in text and "(default: )" not in text  # "": nothing to show


def test_tuple_items_are_checked_and_the_error_names_flag_value_and_expected(capsys):
    with pytest.raises(SystemExit):
        parse_lists("r", "--clients", "4,x")
    assert "argument --clients: invalid comma-separated int value: '4,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_lists("r", "--methods", "ours,bogus")
    err = " ".join(capsys.readouterr().err.split())
    assert "argument --methods: 'ours,bogus' has unknown 'bogus'" in err
    assert "ours, centralized" in err


def test_nargs_plus_takes_several_arguments_and_checks_each_choice(capsys):
    @dataclass(frozen=True)
    class Several:
        algos: tuple[str, ...] = option(MISSING, "algorithms", ("a", "b"), positional=True,
                                        nargs="+")

    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_arguments(parser, Several)
    assert dataclass_from_namespace(Several, parser.parse_args(["a", "b", "a"])) == \
        Several(algos=("a", "b", "a"))
    with pytest.raises(SystemExit):
        parser.parse_args(["a", "c"])
    assert "invalid choice: 'c'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "ALGOS" in capsys.readouterr().err

    @dataclass
    class NotATuple:
        name: str = option("x", "one name", nargs="+")

    with pytest.raises(TypeError, match="NotATuple.name"):
        add_dataclass_arguments(argparse.ArgumentParser(), NotATuple)


def test_a_required_switch_must_be_given(capsys):
    @dataclass(frozen=True)
    class Switch:
        shell: bool = option(False, "print shell lines", required=True)

    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_arguments(parser, Switch)
    assert dataclass_from_namespace(Switch, parser.parse_args(["--shell"])) == Switch(shell=True)
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "--shell" in capsys.readouterr().err


@dataclass(frozen=True)
class Rates:
    lr: float = option(0.01, "a rate")
    cap: float | None = option(None, "an optional number")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_a_float_flag_takes_finite_numbers_only(text, capsys):
    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_arguments(parser, Rates)
    assert dataclass_from_namespace(Rates, parser.parse_args(["--lr", "1e-3", "--cap", "2"])) \
        == Rates(0.001, 2.0)
    for flag in ("--lr", "--cap"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"{flag}={text}"])
        assert f"argument {flag}: '{text}' is not a finite number" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"--lr is (nan|inf|-inf), expected a finite number"):
        check_finite(Rates(lr=float(text)))
    check_finite(Rates())
