"""paper_configs.py's time to target: each method against the centralized run with its layers,
the target its best validation micro-F1 less one point, the seconds those of the first
evaluation at or above it."""
from __future__ import annotations

import json

from benchmarks.paper_configs import (PaperConfigArgs, chosen_lr, flags_for, lrs_of,
                                      reference_of, run_dir, table, target_cell, target_of)
from fgl_common.cli import explicit_dests
from mpifgl.config import TrainConfig, build_parser, parse_config
from mpifgl.methods import get_method


def finished(out, vals, seconds_per_epoch, test=0.7):
    """A run whose evaluations (every epoch) scored ``vals`` on validation."""
    out.mkdir(parents=True)
    ranks = {"compute_seconds": [seconds_per_epoch] * 9, "comm_seconds": [0.0] * 9,
             "bytes_sent": [0] * 9, "bytes_received": [0] * 9,
             "exchange_bytes_sent": [0] * 9, "peak_rss_mb": [100.0] * 9}
    with open(out / "metrics.jsonl", "w") as stream:
        for epoch, val in enumerate(vals, start=1):
            stream.write(json.dumps({"epoch": epoch, "loss": 1.0, "per_rank": ranks,
                                     "epoch_seconds": seconds_per_epoch,
                                     "elapsed_seconds": epoch * seconds_per_epoch,
                                     "val_micro_f1": val, "test_micro_f1": test}) + "\n")
    best = max(range(len(vals)), key=vals.__getitem__)
    (out / "final.json").write_text(json.dumps({"test_micro_f1": test, "best_epoch": best + 1,
                                                "best_val_micro_f1": vals[best]}))


def test_each_method_is_timed_to_the_centralized_run_with_its_layers(tmp_path):
    assert reference_of("ours") == "centralized" and reference_of("fedavg") == "centralized"
    assert reference_of("ours-sage") == "centralized-sage"
    assert reference_of("centralized-sage") == "centralized-sage"
    args = PaperConfigArgs(work=tmp_path, proxies=("products",), lrs=(0.01,), seeds=(0,),
                           methods=("ours", "centralized", "ours-sage", "centralized-sage"),
                           products_epochs=4)
    finished(run_dir(args, "products", "centralized", 0.01, 0), [0.50, 0.60, 0.70, 0.70], 10.0)
    finished(run_dir(args, "products", "ours", 0.01, 0), [0.55, 0.68, 0.69, 0.72], 3.0)
    finished(run_dir(args, "products", "centralized-sage", 0.01, 0), [0.6, 0.8, 0.8, 0.8], 5.0)
    finished(run_dir(args, "products", "ours-sage", 0.01, 0), [0.5, 0.6, 0.7, 0.78], 1.0)
    assert abs(target_of(args, "products", "ours") - 0.69) < 1e-12
    # ours first reached 0.69 at its third evaluation, 9 s in; centralized at its third, 30 s
    target, sage_target = (target_of(args, "products", m) for m in ("ours", "ours-sage"))
    assert target_cell(args, "products", "ours", 0.01, target, [0]) == "9 (e 3)"
    assert target_cell(args, "products", "centralized", 0.01, target, [0]) == "30 (e 3)"
    # 0.78 < 0.79
    assert target_cell(args, "products", "ours-sage", 0.01, sage_target, [0]) == "not reached"
    text = table(args, [], "gcn")
    assert "| 9 (e 3) |" in text and "| not reached |" in text
    assert "Centralized GCN 69.00; Centralized SAGE 79.00" in text


def test_no_target_without_the_centralized_run(tmp_path):
    args = PaperConfigArgs(work=tmp_path, proxies=("products",), lrs=(0.01,), seeds=(0,),
                           methods=("ours",), products_epochs=2)
    finished(run_dir(args, "products", "ours", 0.01, 0), [0.5, 0.6], 1.0)
    assert target_of(args, "products", "ours") is None
    assert "| no target |" in table(args, [], "gcn")


def test_a_method_with_its_own_lr_runs_at_it_alone_and_is_timed_against_centralized(tmp_path):
    """FedGCN's rows keep their reference SGD lr, as in the study: no search over --lrs, and the
    table reads its run at that lr."""
    args = PaperConfigArgs(work=tmp_path, proxies=("products",), lrs=(0.1, 0.01), seeds=(0,),
                           methods=("centralized", "fedgcn", "fedgcn-sym"), products_epochs=2)
    assert lrs_of(args, "centralized") == (0.1, 0.01)
    assert lrs_of(args, "fedgcn") == (0.5,) and lrs_of(args, "fedgcn-sym") == (0.01,)
    finished(run_dir(args, "products", "centralized", 0.01, 0), [0.5, 0.7], 2.0)
    finished(run_dir(args, "products", "fedgcn", 0.5, 0), [0.69, 0.7], 4.0)
    assert chosen_lr(args, "products", "fedgcn") == 0.5
    row = next(line for line in table(args, [], "gcn").splitlines()
               if line.startswith("| FedGCN 2-hop"))
    assert "| 0.5 |" in row and row.endswith("| 4 (e 1) |")


def test_the_neighbour_sampling_methods_get_one_fan_out_per_layer_of_the_proxy(tmp_path):
    """The products proxy has 3 layers: mpifgl.train's fan-out defaults follow --layers
    (GraphSAGE 15,10,5, LLCG 10 per layer), so the benchmark passes none. A --method-flags
    --fanouts wins."""
    args = PaperConfigArgs(work=tmp_path, proxies=("products",), lrs=(0.01,), seeds=(0,),
                           methods=("graphsage", "llcg"))

    def resolved(run_args: PaperConfigArgs, method: str) -> TrainConfig:
        argv = ["--algo", method, *flags_for(run_args, "products", method, 0.01, 0, [])]
        config = parse_config(argv)
        return config.replace(**get_method(method).default_changes(
            explicit_dests(build_parser(), argv), config.layers))

    for method, fanouts in (("graphsage", (15, 10, 5)), ("llcg", (10, 10, 10))):
        config = resolved(args, method)
        config.validate()
        assert (config.layers, config.fanouts) == (3, fanouts)
    own = PaperConfigArgs(work=tmp_path, proxies=("products",), methods=("llcg",),
                          method_flags=("llcg:--fanouts=5,5,5",))
    assert resolved(own, "llcg").fanouts == (5, 5, 5)
