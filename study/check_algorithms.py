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

from mpifgl.methods import get_method


def import_errors(algos: list[str]) -> dict[str, str]:
    """``algo -> "ExceptionType: message"`` for every algorithm whose trainer does not import."""
    errors = {}
    for algo in algos:
        try:
            get_method(algo).builder()
        except Exception as exc:  # any failure to import makes the method unavailable
            errors[algo] = f"{type(exc).__name__}: {exc}"
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.check_algorithms",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("algos", nargs="+", help="--algo values of mpifgl.train")
    print(json.dumps(import_errors(parser.parse_args(argv).algos)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
