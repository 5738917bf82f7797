"""The README's commands fit together (no command is run)."""
from __future__ import annotations

import re
from pathlib import Path

from fgl_common.shard_format import default_shard_dir

from tests.helpers.mpi import REPO


def test_readme_commands_fit_together():
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    for run, reference in re.findall(r"python -m mpifgl\.bias (\S+) --reference (\S+)", text):
        for run_dir in (run, reference):
            command = next(line for line in text.splitlines() if f"--out {run_dir}" in line)
            assert "--save-logits" in command, command
    prep = re.search(r"DATASET=(\S+) NUM_CLIENTS=(\d+) sbatch jobs/data_prep\.sbatch", text)
    shard_dir = re.search(r"SHARD_DIR=(\S+) sbatch -n \d+ jobs/train\.sbatch", text).group(1)
    assert Path(shard_dir) == default_shard_dir(prep.group(1), int(prep.group(2)))
