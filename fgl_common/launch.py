"""The one Open MPI launch environment: what every ``mpirun`` of this project runs with.

Python callers take ``mpi_launch_env()``; shell callers read the same data through

    python -m fgl_common.launch --shell       # `export NAME=VALUE ...`, values as set now
    python -m fgl_common.launch --activate    # lines for the venv's activate script

A value already in the environment wins everywhere, so a site, a user or a launcher can override
any of them: ``--shell`` (``jobs/common.sh``, just before ``mpirun``) prints the value the
environment has when it runs; ``--activate`` (``scripts/setup.sh`` writes its lines into
``.venv/bin/activate``) prints lines that set a variable only where the shell sourcing them has
none (``: "${NAME=value}"``), so activating the venv never replaces a user's
``PRTE_MCA_rmaps_default_mapping_policy`` (a multi-host mapping, say).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from fgl_common.cli import add_dataclass_arguments, option

# More ranks than cores is the normal case here (1 server + M clients on a laptop, a 2-core VM
# or an allocation of a few cores); Open MPI 5 refuses it unless told. The mapper is named:
# the modifier alone put every rank of a two-node allocation on its first node.
ALWAYS = {"PRTE_MCA_rmaps_default_mapping_policy": "slot:oversubscribe"}

# Open MPI refuses to start as root unless told (containers and VMs often run as root).
ROOT_ONLY = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

# Read by Open MPI when mpi4py initialises MPI, so ``mpifgl.comm`` sets them (environment wins)
# just before importing mpi4py; launchers need not export them. Which non-blocking collective
# algorithm serves the exchange's reduce and the gradient broadcast: docs/training.md has why.
RUNTIME_TUNING = {"OMPI_MCA_coll_libnbc_ireduce_algorithm": "binomial",
                  "OMPI_MCA_coll_libnbc_ibcast_algorithm": "linear"}

# Each rank of an oversubscribed run gets one torch/OpenMP thread: ranks share the cores.
ONE_THREAD_PER_RANK = {"OMP_NUM_THREADS": "1"}


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def launch_variables(as_root: bool | None = None) -> dict[str, str]:
    """The variables a launcher exports for ``mpirun`` (``ALWAYS``, plus ``ROOT_ONLY`` as root)."""
    as_root = running_as_root() if as_root is None else as_root
    return {**ALWAYS, **(ROOT_ONLY if as_root else {})}


def mpi_launch_env(base: Mapping[str, str] = os.environ, *, one_thread_per_rank: bool = True,
                   as_root: bool | None = None) -> dict[str, str]:
    """``base`` plus the launch variables it does not set already; with ``one_thread_per_rank``
    also ``OMP_NUM_THREADS=1`` (forced: a job-wide thread count would oversubscribe the cores)."""
    env = dict(base)
    for name, value in launch_variables(as_root).items():
        env.setdefault(name, value)
    if one_thread_per_rank:
        env.update(ONE_THREAD_PER_RANK)
    return env


def mpirun_path() -> str:
    """The ``mpirun`` next to this Python (the venv's, from the Open MPI wheel), else on PATH."""
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else (shutil.which("mpirun") or "mpirun")


def shell_exports(base: Mapping[str, str] = os.environ, as_root: bool | None = None) -> list[str]:
    """``export NAME=VALUE ...`` lines, one per group of launch variables (``ALWAYS``, then
    ``ROOT_ONLY`` as root), with the value from ``base`` where it sets one."""
    as_root = running_as_root() if as_root is None else as_root
    groups = [ALWAYS, ROOT_ONLY] if as_root else [ALWAYS]
    return ["export " + " ".join(f"{name}={shlex.quote(base.get(name, value))}"
                                 for name, value in group.items()) for group in groups]


# a value the activate lines can hold unquoted inside "${NAME=value}"
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_:.,/+-]+")


def activate_lines(as_root: bool | None = None) -> list[str]:
    """Lines for a venv's activate script: each launch variable (``ALWAYS``, plus ``ROOT_ONLY``
    as root) set to its value only where the sourcing shell has none, then exported."""
    as_root = running_as_root() if as_root is None else as_root
    lines = ["# each only where it is not set yet: a value of the user or the launcher wins"]
    for name, value in launch_variables(as_root).items():
        if not PLAIN_VALUE.fullmatch(value):
            raise ValueError(f"{name}={value!r}: a launch variable's value must be plain "
                             f"(letters, digits and _:.,/+-) to go unquoted into activate")
        lines.append(f': "${{{name}={value}}}"; export {name}')
    return lines


@dataclass(frozen=True)
class LaunchArgs:
    """The command line of ``python -m fgl_common.launch``: one of its two shell forms."""

    shell: bool = option(False, "print the launch variables as `export NAME=VALUE ...` lines, "
                                "with the values the environment has now where it sets them")
    activate: bool = option(False, "print the lines scripts/setup.sh writes into the venv's "
                                   "activate script: each variable set only where the shell "
                                   "sourcing it has none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fgl_common.launch",
                                     description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, LaunchArgs)
    args = parser.parse_args(argv)
    if args.shell == args.activate:
        parser.error("expected exactly one of --shell and --activate")
    print("\n".join(shell_exports() if args.shell else activate_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
