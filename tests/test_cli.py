"""Plain pytest: fgl_common.cli, the one dataclass-to-flags mechanism of every entry point."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass
from pathlib import Path

import pytest

from fgl_common.cli import (add_dataclass_arguments, dataclass_from_namespace, explicit_dests,
                            flag_name, option)


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
