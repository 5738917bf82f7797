"""The study's configuration: ``StudyConfig`` (every knob of the plan, with the reason for its
default) and ``StudyArgs`` (the command line, one ``--flag`` per field, through
``fgl_common.cli``), which ``study_config`` turns into a ``StudyConfig``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from data_prep.catalog import KNOWN_DATASETS, normalise_dataset_name
from data_prep.config import PARTITION_METHODS
from fgl_common.cli import option
from fgl_common.protected import ProtectedPathError, check_output_directory
from study.catalog import METHODS, SECTIONS


@dataclass(frozen=True)
class StudyConfig:
    """Every knob of the plan. The defaults are the paper's protocol at the size that fits the
    time budget of a 2-core machine (docs/experiments.md): one seed; pass --seeds 0,1,2 on a
    bigger machine."""

    datasets: tuple[str, ...]
    out: Path
    seeds: tuple[int, ...] = (0,)  # Table 2 / Table 5 seeds (mean and std when > 1)
    epochs: int = 200  # Table 2 / 5 epochs (the paper's)
    dataset_epochs: tuple[tuple[str, int], ...] = ()  # per-dataset override of ``epochs``
    # GraphSAGE and GraphSAINT take many mini-batch steps per epoch: they get the epochs that
    # give them about as many optimizer steps as the full-batch methods take in ``epochs`` (see
    # ``study.plan.equal_step_epochs``), but at least ``min_minibatch_epochs`` passes over the
    # data, below which they stop short of their accuracy (docs/experiments.md).
    equal_steps: bool = True
    min_minibatch_epochs: int = 40
    figure_datasets: tuple[str, ...] = ("cora",)  # figures 3-6 and table 3: smallest graph
    # one seed by default (the figures' runs are the plan's bulk); several give mean ± std
    figure_seeds: tuple[int, ...] = (0,)
    figure_epochs: int = 200  # = epochs: the 8-client runs are shared with Table 2
    client_counts: tuple[int, ...] = (4, 8, 16, 32)  # figure 3 (the paper's)
    # figure 4: the paper's iid (random) and non-iid (label-skew); louvain and dirichlet are the
    # partitions FGL papers use (FedSage+'s reference: Louvain; FedGCN's: Dirichlet)
    figure_partitions: tuple[str, ...] = ("random", "label-skew")
    main_clients: int = 8  # Table 2: the paper's 8 clients
    overhead_clients: tuple[int, ...] = (4, 8)  # table 3 (the paper's)
    ablation_datasets: tuple[str, ...] = ("cora",)  # table 5; empty: all --datasets
    step_lengths: tuple[int, ...] = (1, 2, 4, 8)  # figure 5: steps per epoch
    fig5_nodes_fraction: float = 1.0  # figure 5: nodes drawn per epoch, as a fraction of n
    fig5_epochs: int = 5  # figure 5: the paper averages 10 epochs; 5 suffice for a mean
    only: tuple[str, ...] = SECTIONS
    # the rows to run of those sections (empty: every row); the centralized references of the
    # local bias are planned whatever this says, as the figures need them
    methods: tuple[str, ...] = ()
    lr: float = 0.01  # fixed lr when --lr-search is off (the paper's middle value)
    lr_search: bool = False
    data_root: str | None = None
    timeout: float = 900.0  # per run
    budget_minutes: float = 0.0  # > 0: launch no run that would end after this (0: no limit)
    retry_failed: bool = False
    dry_run: bool = False

    @classmethod
    def quick(cls, **values) -> "StudyConfig":
        """Minutes-scale smoke version: one seed, 2 epochs, 2-3 clients."""
        base = dict(seeds=(0,), epochs=2, figure_seeds=(0,), figure_epochs=2, dataset_epochs=(),
                    client_counts=(2, 3), main_clients=2, overhead_clients=(2,),
                    step_lengths=(1, 2), fig5_epochs=2, timeout=120.0)
        base.update(values)
        if "datasets" in values and "figure_datasets" not in values:
            base["figure_datasets"] = tuple(values["datasets"][:1])
        return cls(**base)

    def epochs_for(self, dataset: str) -> int:
        """Table 2 / 5 epochs of ``dataset`` (per-dataset override, else --epochs)."""
        return dict(self.dataset_epochs).get(dataset, self.epochs)

    def validate(self) -> None:
        """ValueError naming the flag at fault: a value that makes the study meaningless
        (every run of an unknown dataset would fail) is refused before anything runs, with
        --dry-run too."""
        if not self.datasets:
            raise ValueError("--datasets is empty, expected a comma-separated list")
        for flag, names in (("--datasets", self.datasets),
                            ("--figure-datasets", self.figure_datasets),
                            ("--ablation-datasets", self.ablation_datasets)):
            unknown = [name for name in names if name not in KNOWN_DATASETS]
            if unknown:
                raise ValueError(f"{flag} {','.join(unknown)}: unknown dataset"
                                 f"{'s' if len(unknown) > 1 else ''}, expected some of "
                                 f"{','.join(KNOWN_DATASETS)} (data_prep's names)")
        try:  # the report directory holds runs and shards of its own, never inside another's
            check_output_directory(self.out, "--out", None)
        except ProtectedPathError as exc:
            raise ValueError(str(exc)) from None
        unknown = [s for s in self.only if s not in SECTIONS]
        if unknown:
            raise ValueError(f"--only {','.join(unknown)}: unknown section(s), expected some of "
                             f"{','.join(SECTIONS)}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"--methods {','.join(unknown)}: unknown method(s), expected some "
                             f"of {','.join(METHODS)}")
        unknown = [p for p in self.figure_partitions if p not in PARTITION_METHODS]
        if not self.figure_partitions or unknown:
            found = ",".join(unknown) if unknown else "is empty"
            raise ValueError(f"--figure-partitions {found}: expected some of "
                             f"{','.join(PARTITION_METHODS)} (data_prep's --partition)")
        for flag, seeds in (("--seeds", self.seeds), ("--figure-seeds", self.figure_seeds)):
            if not seeds or any(s < 0 for s in seeds):
                raise ValueError(f"{flag} {','.join(map(str, seeds))}: expected "
                                 f"non-negative integers")
        if self.epochs < 1 or self.figure_epochs < 1:
            raise ValueError(f"--epochs {self.epochs}: expected an integer >= 1")
        if self.lr <= 0:
            raise ValueError(f"--lr {self.lr}: expected a positive number")


@dataclass(frozen=True)
class StudyArgs:
    """The command line of ``python -m study``. Lists are comma-separated; a flag left out
    keeps ``StudyConfig``'s default (or ``--quick``'s)."""

    datasets: tuple[str, ...] = option(None, "datasets, e.g. "
                                             "cora,citeseer,amazon-computers,coauthor-cs",
                                       required=True)
    out: Path = option(None, "report directory", required=True)
    seeds: tuple[int, ...] | None = option(None, "Table 2/5 seeds (default 0: the 90-minute "
                                                 "plan; e.g. 0,1,2)")
    epochs: int | None = option(None, "epochs of Table 2/5 runs (default 200, the paper's; "
                                      "quick: 2)")
    figure_epochs: int | None = option(None, "epochs of the figure runs (default 200; quick: 2)")
    figure_datasets: tuple[str, ...] | None = option(None, "datasets of figures 3-6 and table 3 "
                                                           "(default: cora, else the first of "
                                                           "--datasets)")
    figure_seeds: tuple[int, ...] | None = option(None, "seeds of figures 3-6 and table 3 "
                                                        "(default: the first of --seeds; e.g. "
                                                        "0,1,2 for mean ± std)")
    figure_partitions: tuple[str, ...] | None = option(None, "partitions of figure 4 (default "
                                                             "random,label-skew, the paper's iid "
                                                             "and non-iid; also louvain, "
                                                             "dirichlet, metis)")
    ablation_datasets: tuple[str, ...] | None = option(None, "datasets of table 5 (default: cora)")
    clients: tuple[int, ...] | None = option(None, "figure 3 client counts (default 4,8,16,32, "
                                                   "the paper's)")
    same_epochs: bool = option(False, "run GraphSAGE and GraphSAINT for --epochs epochs too "
                                      "(default: the epochs that give them about --epochs "
                                      "optimizer steps)")
    quick: bool = option(False, "smoke test: 1 seed, 2 epochs, 2-3 clients")
    only: tuple[str, ...] = option(SECTIONS, f"sections to run, some of {','.join(SECTIONS)}",
                                   choices=SECTIONS)
    methods: tuple[str, ...] = option((), "run only these rows of the sections (e.g. "
                                          "llcg,fedsage-plus; default: all) and the centralized "
                                          "references of their local bias; the plan and report "
                                          "then hold those (--dry-run without it plans every "
                                          "row again, --report-only then reports them all)",
                                   choices=tuple(METHODS))
    data_root: str | None = option(None, "raw datasets directory (data_prep's --data-root)")
    lr: float = option(0.01, "fixed lr without --lr-search")
    lr_search: bool = option(False, "pick lr in {0.1, 0.01, 0.001} per dataset and method on "
                                    "seed seeds[0] by best validation micro-F1")
    timeout: float | None = option(None, "seconds per run (900)")
    budget_minutes: float = option(0.0, "launch no run that the cost model (scaled by the runs "
                                        "measured so far) expects to end after this many "
                                        "minutes; such runs are reported as 'budget' and run on "
                                        "the next invocation")
    retry_failed: bool = option(False, "run again the runs recorded as failed")
    dry_run: bool = option(False, "print the plan and its estimated duration, run nothing")
    report_only: bool = option(False, "rewrite the report from the runs present, run nothing")


def _canonical(name: str) -> str:
    """data_prep's spelling of a known dataset ("Cora" -> "cora"); unknown names stay as given
    (``StudyConfig.validate`` names them)."""
    try:
        return normalise_dataset_name(name)
    except ValueError:
        return name


def study_config(args: StudyArgs) -> StudyConfig:
    """The plan's configuration from the command line; ValueError names the flag at fault."""
    values = {"datasets": args.datasets, "out": args.out, "only": args.only, "lr": args.lr,
              "lr_search": args.lr_search, "data_root": args.data_root,
              "retry_failed": args.retry_failed, "dry_run": args.dry_run, "budget_minutes": args.budget_minutes,
              "equal_steps": not args.same_epochs, "methods": args.methods}
    optional = {
        "seeds": args.seeds, "epochs": args.epochs, "figure_epochs": args.figure_epochs,
        "figure_datasets": args.figure_datasets, "client_counts": args.clients,
        "figure_partitions": args.figure_partitions, "ablation_datasets": args.ablation_datasets,
        "timeout": args.timeout}
    values.update({k: v for k, v in optional.items() if v is not None})
    for key in ("datasets", "figure_datasets", "ablation_datasets"):  # data_prep's spelling
        if key in values:
            values[key] = tuple(_canonical(name) for name in values[key])
    if args.figure_seeds is not None:
        values["figure_seeds"] = args.figure_seeds
    elif "seeds" in values:
        values["figure_seeds"] = values["seeds"][:1]
    if args.epochs is not None:
        values["dataset_epochs"] = ()  # an explicit --epochs applies to every dataset
    config = StudyConfig.quick(**values) if args.quick else StudyConfig(**values)
    if args.figure_datasets is None and not args.quick:
        config = replace(config, figure_datasets=("cora",) if "cora" in config.datasets
                         else config.datasets[:1])
    config.validate()
    return config
