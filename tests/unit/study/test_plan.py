"""The study's plan (pure: no process is started): deduplication, references, the equal-steps
rule, --quick, the training commands, the cost model and the command line."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from study.__main__ import parse_config
from study.catalog import methods_of
from study.config import StudyConfig
from study.plan import (RunSpec, build_plan, equal_step_epochs, estimate_seconds,
                        lr_search_plan)
from study.runner import subprocess_env, train_command
from tests.helpers import REPO


def _plan(**values):
    defaults = dict(epochs=100, figure_epochs=100, dataset_epochs=(),
                    client_counts=(4, 8, 16, 32))
    defaults["datasets"] = ("cora", "citeseer")
    config = StudyConfig(out=Path("/tmp/x"), **{**defaults, **values})
    return build_plan(config, lambda d, m: 0.01, lambda d: 1000)


def test_plan_deduplicates_and_attaches_references():
    plan = _plan(seeds=(0, 1), figure_seeds=(0,))
    keys = list(plan.runs)
    assert len(keys) == len(set(keys))
    ours8 = plan.runs["cora/random-m8/ours-lr0.01-e100-s0"]
    # one run serves table 2, figure 3, figure 4 and table 3
    assert {"table2", "fig3", "fig4", "table3"} <= set(ours8.sections)
    assert ours8.reference == "cora/random-m8/centralized-lr0.01-e100-s0"
    assert ours8.noise_reference == "cora/random-m8/centralized-lr0.01-e100-s1"
    same_init = plan.runs[ours8.same_init_reference].spec
    assert ours8.same_init_reference == "cora/random-m8/centralized-init0-lr0.01-e100-s1"
    assert same_init.flags == ("--init-seed", "0") and same_init.seed == 1
    assert "cora/random-m32/fedavg-nc-lr0.01-e100-s0" in plan.runs
    assert "cora/label-skew-m8/fedavg-lr0.01-e100-s0" in plan.runs
    assert not any(k.startswith("citeseer/random-m32") for k in keys)  # figures: cora only
    fig5 = [p.spec for p in plan.runs.values() if "fig5" in p.sections]
    assert [s.flags for s in fig5][1] == ("--steps-per-epoch", "2", "--sample-size", "500")


def test_minibatch_baselines_get_about_as_many_steps_as_full_batch_methods():
    # amazon-computers: 8,252 training nodes -> 17 GraphSAGE steps per epoch; 13,752 nodes ->
    # about 9 GraphSAINT subgraphs of at most 512 x 3 nodes per epoch.
    assert equal_step_epochs("graphsage", 200, 13752, 8252) == 12  # 12 x 17 = 204 steps
    assert equal_step_epochs("graphsaint", 200, 13752, 8252) == 23  # 23 x 9 = 207 steps
    assert equal_step_epochs("ours", 200, 13752, 8252) == 200
    assert equal_step_epochs("graphsage", 200, 100, 40) == 200  # one batch per epoch
    assert equal_step_epochs("graphsage", 200, 13752, 8252, min_epochs=40) == 40  # the floor
    assert equal_step_epochs("graphsage", 2, 13752, 8252, min_epochs=40) == 2  # never > epochs
    config = StudyConfig(out=Path("/tmp/x"), datasets=("amazon-computers",), only=("table2",),
                         epochs=200, min_minibatch_epochs=20)
    sizes = (lambda d: 13752), (lambda d: 8252)
    plan = build_plan(config, lambda d, m: 0.01, *sizes)
    epochs = {p.spec.method: p.spec.epochs for p in plan.runs.values()}
    assert epochs["graphsage"] == 20 and epochs["graphsaint"] == 23 and epochs["fedavg"] == 200
    search = {(s.method, s.epochs) for s in lr_search_plan(config, *sizes)}
    assert ("graphsage", 20) in search and ("ours", 200) in search
    unequal = build_plan(StudyConfig(out=Path("/tmp/x"), datasets=("amazon-computers",),
                                     only=("table2",), epochs=200, equal_steps=False),
                         lambda d, m: 0.01, *sizes)
    assert {p.spec.epochs for p in unequal.runs.values()} == {200}


def test_plan_only_and_quick():
    plan = _plan(only=("table2",), seeds=(0,))
    assert len(plan.runs) == 2 * len(methods_of("table2")) and all(p.sections == ["table2"]
                                                                 for p in plan.runs.values())
    big = _plan(only=("table2",), datasets=("cora", "amazon-computers"), seeds=(0,),
                dataset_epochs=(("amazon-computers", 40),))
    assert {p.spec.epochs for p in big.runs.values() if p.spec.dataset != "cora"} == {40}
    quick = StudyConfig.quick(datasets=("cora",), out=Path("/tmp/x"), only=("fig3",))
    runs = build_plan(quick, lambda d, m: 0.01, lambda d: 100).runs
    assert {p.spec.num_clients for p in runs.values()} == {2, 3}
    assert all(p.spec.epochs == 2 for p in runs.values())


def test_a_method_with_its_own_lr_keeps_it_and_stays_out_of_the_search():
    """FedGCN's SGD at its reference lr 0.5: neither the study's --lr nor its Adam grid."""
    plan = _plan(only=("table2", "fig3"), seeds=(0,))
    assert "cora/random-m8/fedgcn-lr0.5-e100-s0" in plan.runs
    assert "cora/random-m16/fedgcn-0hop-lr0.5-e100-s0" in plan.runs
    assert "cora/random-m8/fedavg-lr0.01-e100-s0" in plan.runs
    command = train_command(plan.runs["cora/random-m8/fedgcn-1hop-lr0.5-e100-s0"].spec,
                            Path("S"), Path("R"))
    assert command[command.index("--lr") + 1] == "0.5" and command[-2:] == ["--hops", "1"]
    searched = {s.method for s in lr_search_plan(StudyConfig(out=Path("/tmp/x"),
                                                             datasets=("cora",)))}
    assert "fedavg" in searched and not searched & {"fedgcn", "fedgcn-1hop", "fedgcn-0hop"}


def test_command_and_estimate():
    spec = RunSpec("cora", "ours-star", 4, "random", 1, 5, 0.1)
    command = train_command(spec, Path("S"), Path("R"))
    assert command[1:3] == ["-n", "5"] and command[-1] == "--no-normalize"
    assert "--save-logits" in command and command[command.index("--lr") + 1] == "0.1"
    central = RunSpec("cora", "centralized", 8, "random", 0, 5, 0.01)
    assert train_command(central, Path("S"), Path("R"))[0] == sys.executable
    assert estimate_seconds(spec, 2708) > estimate_seconds(central, 2708)
    # LLCG's rounds are K local steps each: its estimate grows with K, far above FedAvg's
    fedavg = RunSpec("cora", "fedavg", 8, "random", 0, 200, 0.01)
    llcg = replace(fedavg, method="llcg")
    assert estimate_seconds(llcg, 2708) > 10 * estimate_seconds(fedavg, 2708)
    fewer = replace(llcg, flags=("--llcg-local-steps", "8"), tag="k8")
    assert estimate_seconds(fewer, 2708) < estimate_seconds(llcg, 2708) / 4


def test_figure4_runs_every_partition_given_against_one_centralized_reference(capsys):
    config, _ = parse_config(["--datasets", "cora", "--out", "x", "--only", "fig4",
                              "--methods", "fedavg", "--figure-partitions", "random,louvain"])
    assert config.figure_partitions == ("random", "louvain")
    runs = build_plan(config, lambda d, m: 0.01, lambda d: 1000).runs
    louvain = runs["cora/louvain-m8/fedavg-lr0.01-e200-s0"]
    assert louvain.spec.shard_name == "cora-louvain-m8-s0"
    assert louvain.reference == runs["cora/random-m8/fedavg-lr0.01-e200-s0"].reference == \
        "cora/random-m8/centralized-lr0.01-e200-s0"
    assert not any("/label-skew-" in key for key in runs)
    assert StudyConfig(datasets=("cora",), out=Path("/tmp/x")).figure_partitions == \
        ("random", "label-skew")  # the paper's iid and non-iid
    for given, message in (("random,file:a.npy", "--figure-partitions file:a.npy: expected some "
                                                 "of random,label-skew,metis,dirichlet,louvain"),
                           ("", "--figure-partitions is empty: expected some of")):
        with pytest.raises(SystemExit):
            parse_config(["--datasets", "cora", "--out", "x", "--figure-partitions", given])
        assert message in capsys.readouterr().err


def test_cli_rejects_unknown_section(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--only", "table9"])
    assert "table9" in capsys.readouterr().err


def test_cli_reads_comma_lists_and_quick_defaults():
    config, report_only = parse_config(["--datasets", "citeseer,cora", "--out", "x",
                                        "--seeds", "1,2", "--clients", "4,8", "--same-epochs"])
    assert config.datasets == ("citeseer", "cora") and config.seeds == (1, 2)
    assert config.figure_seeds == (1,) and config.client_counts == (4, 8)
    assert config.figure_datasets == ("cora",) and not config.equal_steps and not report_only
    several, _ = parse_config(["--datasets", "cora", "--out", "x", "--seeds", "1,2",
                               "--figure-seeds", "0,1,2", "--only", "fig4"])
    assert several.seeds == (1, 2) and several.figure_seeds == (0, 1, 2)
    fig4 = build_plan(several, lambda d, m: 0.01, lambda d: 1000).runs
    assert {fig4[k].spec.seed for k in fig4 if "/label-skew-m8/fedavg-" in k} == {0, 1, 2}
    # each seed's bias is measured against the centralized run of that seed
    assert fig4["cora/label-skew-m8/fedavg-lr0.01-e200-s2"].reference == \
        "cora/random-m8/centralized-lr0.01-e200-s2"
    quick, _ = parse_config(["--datasets", "citeseer", "--out", "x", "--quick", "--report-only"])
    assert quick.epochs == 2 and quick.main_clients == 2 and quick.figure_datasets == ("citeseer",)


def test_methods_keeps_those_rows_and_the_references_of_their_bias(capsys):
    plan = _plan(only=("table2", "fig4"), seeds=(0, 1), methods=("llcg", "fedsage-plus"))
    methods = {p.spec.method for p in plan.runs.values()}
    assert methods == {"llcg", "fedsage-plus", "centralized"}
    assert "citeseer/random-m8/llcg-lr0.01-e100-s1" in plan.runs  # table 2, every seed
    skew = plan.runs["cora/label-skew-m8/fedsage-plus-lr0.01-e100-s0"]
    assert skew.reference in plan.runs and skew.same_init_reference in plan.runs
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--methods", "llcg,fedsage"])
    assert "argument --methods: 'llcg,fedsage' has unknown 'fedsage'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--methods nope: unknown method"):
        StudyConfig(datasets=("cora",), out=Path("/tmp/x"), methods=("nope",)).validate()


def test_cli_names_the_bad_flag(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--seeds", "0,one"])
    assert "argument --seeds: invalid comma-separated int value: '0,one'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--only", "table2,table9"])
    assert ("argument --only: 'table2,table9' has unknown 'table9', expected comma-separated "
            "values among") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", "x", "--figure-seeds", "0,-1"])
    assert "--figure-seeds 0,-1: expected non-negative integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--datasets", ",", "--out", "x"])
    assert "--datasets is empty, expected a comma-separated list" in capsys.readouterr().err


def test_runs_get_one_thread_per_rank_and_this_checkout_first():
    distributed, single = subprocess_env(True), subprocess_env(False)
    assert distributed["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in single
    assert distributed["PYTHONPATH"].startswith(str(REPO))
    assert distributed["PRTE_MCA_rmaps_default_mapping_policy"]


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_an_unknown_dataset_is_refused_at_start_naming_the_known_ones(capsys, extra):
    from data_prep.catalog import KNOWN_DATASETS
    with pytest.raises(SystemExit) as stopped:
        parse_config(["--datasets", "cora,nosuch", "--out", "x", *extra])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and (
        f"error: --datasets nosuch: unknown dataset, expected some of "
        f"{','.join(KNOWN_DATASETS)} (data_prep's names)") in err
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--ablation-datasets", "pubmd", "--out", "x"])
    assert "--ablation-datasets pubmd: unknown dataset" in capsys.readouterr().err
    assert parse_config(["--datasets", "Cora,CiteSeer", "--out", "x"])[0].datasets == (
        "cora", "citeseer")  # data_prep's spelling of the names it knows


def test_a_study_never_writes_into_a_run_or_shard_directory(tmp_path, capsys, toy_shards):
    shards = toy_shards(2)
    with pytest.raises(SystemExit):
        parse_config(["--datasets", "cora", "--out", str(shards / "study"), "--dry-run"])
    assert (f"--out {shards / 'study'}: it lies inside the shard directory {shards}"
            in capsys.readouterr().err)
