"""The one Open MPI launch environment (fgl_common.launch), for Python and for shell callers."""
from __future__ import annotations

from pathlib import Path

from fgl_common import launch
from fgl_common.launch import (ALWAYS, ROOT_ONLY, RUNTIME_TUNING, mpi_launch_env, mpirun_path,
                               shell_exports)

from tests.helpers import REPO


def test_env_adds_what_is_missing_and_keeps_what_is_set():
    env = mpi_launch_env({"PRTE_MCA_rmaps_default_mapping_policy": ":site", "HOME": "/h",
                          "OMP_NUM_THREADS": "8"}, as_root=False)
    assert env["PRTE_MCA_rmaps_default_mapping_policy"] == ":site" and env["HOME"] == "/h"
    assert env["OMP_NUM_THREADS"] == "1"  # forced: ranks share the cores
    assert not set(ROOT_ONLY) & set(env)
    root = mpi_launch_env({}, as_root=True, one_thread_per_rank=False)
    assert root == {**ALWAYS, **ROOT_ONLY}


def test_shell_exports_one_line_per_group():
    assert shell_exports({}, as_root=False) == [
        "export PRTE_MCA_rmaps_default_mapping_policy=slot:oversubscribe"]
    assert shell_exports({"OMPI_ALLOW_RUN_AS_ROOT": "a b"}, as_root=True)[1] == (
        "export OMPI_ALLOW_RUN_AS_ROOT='a b' OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")


def test_main_prints_the_shell_lines(capsys, monkeypatch):
    monkeypatch.setattr(launch, "running_as_root", lambda: True)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    monkeypatch.delenv("PRTE_MCA_rmaps_default_mapping_policy", raising=False)
    assert launch.main(["--shell"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export PRTE_MCA_rmaps_default_mapping_policy=slot:oversubscribe",
        "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]


def test_runtime_tuning_is_libnbc_only_and_applied_by_comm():
    assert all(name.startswith("OMPI_MCA_coll_libnbc_") for name in RUNTIME_TUNING)
    comm = (REPO / "mpifgl" / "comm.py").read_text()
    assert comm.index("RUNTIME_TUNING.items()") < comm.index("from mpi4py import MPI")


def test_mpirun_path_names_an_mpirun():
    assert Path(mpirun_path()).name == "mpirun"


def test_the_activate_lines_set_a_variable_only_where_it_is_not_set(capsys, monkeypatch):
    """What scripts/setup.sh writes into the venv's activate script: sourcing it keeps a
    user's (or a launcher's) value (the lines run in bash: tests/slurm/test_jobs.py)."""
    from fgl_common.launch import activate_lines
    assert activate_lines(as_root=False)[1:] == [
        ': "${PRTE_MCA_rmaps_default_mapping_policy=slot:oversubscribe}"; '
        'export PRTE_MCA_rmaps_default_mapping_policy']
    assert activate_lines(as_root=True)[2:] == [
        f': "${{{name}=1}}"; export {name}' for name in ROOT_ONLY]
    monkeypatch.setattr(launch, "running_as_root", lambda: False)
    assert launch.main(["--activate"]) == 0
    assert capsys.readouterr().out.splitlines() == activate_lines(as_root=False)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "python -m fgl_common.launch --activate" in setup and "--shell" not in setup
