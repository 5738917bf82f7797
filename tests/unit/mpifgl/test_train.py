"""mpifgl.train in-process: the default run prepares its shards through the data_prep program
(its subprocess replaced here; tests/e2e/test_train.py runs it for real)."""
from __future__ import annotations

import subprocess

import pytest

from mpifgl.config import TrainConfig


def test_default_run_prepares_through_the_data_prep_program(tmp_path, monkeypatch):
    """Training never imports data_prep: the default run's shards come from `python -m data_prep
    --quiet`; shards a rival job installed meanwhile count as prepared; a failure is one line."""
    from mpifgl import train
    commands = []

    def rival_installed_first(command, **kwargs):
        commands.append(command)
        (tmp_path / "shards").mkdir()
        (tmp_path / "shards" / "manifest.json").write_text("{}")
        return subprocess.CompletedProcess(command, 2, "", "data_prep: error: output exists\n")

    monkeypatch.setattr(train.subprocess, "run", rival_installed_first)
    config = TrainConfig(dataset="cora", data_root="raw")
    train.prepare_default_shards(config, tmp_path / "shards", 3)
    command = commands[0]
    assert command[1:3] == ["-m", "data_prep"] and "--quiet" in command
    assert command[command.index("--num-clients") + 1] == "3"
    assert command[command.index("--data-root") + 1] == "raw"

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 2, "", "a warning\ndata_prep: error: no\n")

    monkeypatch.setattr(train.subprocess, "run", failing)
    with pytest.raises(ValueError, match=r"preparing the default shards in \S+other failed: no$"):
        train.prepare_default_shards(config, tmp_path / "other", 3)
