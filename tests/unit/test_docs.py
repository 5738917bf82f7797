"""The documented commands fit together (no command is run): the pipeline of docs/training.md,
the tests docs/reliability.md names."""
from __future__ import annotations

import re
from pathlib import Path

from fgl_common.shard_format import default_shard_dir

from tests.helpers.mpi import REPO


PIPELINE = REPO / "docs" / "training.md"


def test_the_pipelines_commands_fit_together():
    text = PIPELINE.read_text().replace("\\\n", " ")
    for run, reference in re.findall(r"python -m mpifgl\.bias (\S+) --reference (\S+)", text):
        for run_dir in (run, reference):
            command = next(line for line in text.splitlines() if f"--out {run_dir}" in line)
            assert "--save-logits" in command, command
    prep = re.search(r"DATASET=(\S+) NUM_CLIENTS=(\d+) sbatch jobs/data_prep\.sbatch", text)
    shard_dir = re.search(r"SHARD_DIR=(\S+) sbatch -n \d+ jobs/train\.sbatch", text).group(1)
    assert Path(shard_dir) == default_shard_dir(prep.group(1), int(prep.group(2)))


def test_the_pipeline_runs_inside_the_venv():
    text = PIPELINE.read_text()
    block = text[text.index("## The pipeline"):]
    block = block[block.index("```bash") + len("```bash"):]
    assert block.split("\n", 2)[1] == ". .venv/bin/activate"


def test_every_test_the_reliability_page_names_exists():
    text = (REPO / "docs" / "reliability.md").read_text()
    named = set(re.findall(r"`((?:unit|mpi|e2e|slurm)/[\w/]+\.py)::(\w+)", text))
    assert len(named) > 30
    missing = [f"{path}::{name}" for path, name in sorted(named)
               if not (REPO / "tests" / path).is_file()
               or f"def {name}(" not in (REPO / "tests" / path).read_text()]
    assert missing == []
