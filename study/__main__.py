"""The study: every run behind the paper's tables and figures, resumable, with a report.

    python -m study --datasets cora,citeseer,amazon-computers,coauthor-cs --out reports/study \
        [--seeds 0,1,2] [--epochs N] [--quick] [--only table2,fig3,...] [--data-root DIR] \
        [--lr-search] [--same-epochs] [--budget-minutes M] [--dry-run] [--retry-failed] \
        [--report-only]

Builds the plan (``study.plan``), runs it (``study.runner``: shards, subprocesses, timeouts,
resume, budget) and writes the report (``study.report``: CSV, Markdown, PNG plots). Running the
same command again resumes; SIGTERM (e.g. SLURM preemption) behaves like Ctrl-C. Exit status 1
when a run of the plan failed (named, with its reason; the report is written all the same),
2 for a bad flag (an unknown dataset among them, also with --dry-run).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace
from study.config import StudyArgs, StudyConfig, study_config
from study.report import write_report
from study.runner import Study, failed_runs, hms

log = logging.getLogger("study")


def parse_args(argv: list[str] | None) -> StudyArgs:
    parser = argparse.ArgumentParser(prog="python -m study", description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, StudyArgs)
    args = dataclass_from_namespace(StudyArgs, parser.parse_args(argv))
    try:
        study_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def parse_config(argv: list[str] | None) -> tuple[StudyConfig, bool]:
    """The plan's configuration and --report-only, from the command line (exit 2 on bad input)."""
    args = parse_args(argv)
    return study_config(args), args.report_only


def main(argv: list[str] | None = None) -> int:
    config, report_only = parse_config(argv)
    logging.basicConfig(level=logging.INFO, format="[study %(asctime)s] %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stdout)
    study = Study(config)
    try:
        if not report_only:
            study.run()
    except KeyboardInterrupt:
        log.warning("interrupted: finished runs are kept; run the same command again to resume")
        return 130
    if config.dry_run:
        payload = json.loads((Path(config.out) / "plan.json").read_text())
        log.info("plan: %d runs, estimated %s (cost model; see plan.json)",
                 len(payload["runs"]), hms(payload["estimated_seconds"]))
        return 0
    path = write_report(Path(config.out))
    log.info("report written: %s", path)
    failed = failed_runs(Path(config.out))
    if failed:
        named = "; ".join(f"{key} ({reason[:120]})" for key, reason in list(failed.items())[:10])
        more = f"; and {len(failed) - 10} more" if len(failed) > 10 else ""
        log.error("%d run%s failed: %s%s; see %s (`--retry-failed` runs them again)",
                  len(failed), "s" if len(failed) > 1 else "", named, more, path)
        return 1
    return 0


def _sigterm(signum, frame):  # SIGTERM (e.g. SLURM preemption) behaves like Ctrl-C
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    sys.exit(main())
