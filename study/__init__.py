"""The study around mpifgl: the runs behind the paper's tables and figures, and their report.

    catalog   the one method catalog (name, label, --algo and flags, sections)
    config    StudyConfig and the command line
    plan      the deduplicated runs of a configuration, and the cost model
    runner    the driver: shards, subprocesses, timeouts, resume, budget
    rundir    a run directory as the study reads it
    report    CSV tables, PNG plots, report.md

Imports point one way: catalog <- config <- plan <- runner; catalog <- report; all <- __main__.
Nothing in mpifgl, data_prep or fgl_common imports this package.
"""
