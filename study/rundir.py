"""A run directory as the study reads it: ``final.json`` (written last by ``mpifgl.train``),
``metrics.jsonl``, and the driver's own ``driver.json`` / ``FAILED.json``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON in ``path``, or None when missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The per-epoch records of ``run_dir/metrics.jsonl`` (a torn last line is left out)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass  # a torn last line of an interrupted run
    return records


def run_status(run_dir: Path) -> str:
    """done (final.json) | failed (FAILED.json) | partial (directory only) | pending."""
    if (run_dir / "final.json").is_file():
        return "done"
    if (run_dir / "FAILED.json").is_file():
        return "failed"
    return "partial" if run_dir.exists() else "pending"
