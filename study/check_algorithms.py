"""Which ``mpifgl.train --algo`` values import, as one JSON line ``{algo: error}`` (empty when
all do):

    python -m study.check_algorithms ours fedavg bns ...

The driver runs it as a subprocess, so a broken baseline cannot break the study and torch stays
out of the driver.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING, dataclass

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option
from mpifgl.methods import get_method


def import_errors(algos: list[str]) -> dict[str, str]:
    """``algo -> "ExceptionType: message"`` for every algorithm whose trainer does not import."""
    errors = {}
    for algo in algos:
        try:
            get_method(algo).load()
        except Exception as exc:  # any failure to import makes the method unavailable
            errors[algo] = f"{type(exc).__name__}: {exc}"
    return errors


@dataclass(frozen=True)
class CheckArgs:
    """The command line of ``python -m study.check_algorithms``."""

    # no choices: an unknown name is reported in the JSON line, like one that does not import
    algos: tuple[str, ...] = option(MISSING, "--algo values of mpifgl.train", positional=True,
                                    nargs="+")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.check_algorithms",
                                     description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, CheckArgs)
    algos = dataclass_from_namespace(CheckArgs, parser.parse_args(argv)).algos
    print(json.dumps(import_errors(list(algos))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
