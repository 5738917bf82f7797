"""The study's one method catalog: every method is a valid mpifgl.train invocation with a label,
every section's rows come from it (the study's import arrows: tests/unit/test_package_arrows.py)."""
from __future__ import annotations

import pytest

from mpifgl.methods import get_method
from mpifgl.config import parse_config
from study.catalog import (METHODS, REFERENCE_METHOD, SECTION_METHODS, SECTIONS, algo_of,
                           label_of, methods_of)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_is_a_valid_training_with_a_label(name):
    method = METHODS[name]
    assert method.name == name and method.label.strip()
    assert get_method(method.algo).name == method.algo
    config = parse_config(["--algo", method.algo, *method.flags])  # exit 2 on an unknown flag
    assert config.algo == method.algo


def test_labels_are_unique_and_match_the_report_tables():
    labels = [label_of(name) for name in METHODS]
    assert len(labels) == len(set(labels))
    assert label_of("ours") == "Ours (GCN)" and label_of("centralized") == "Centralized GCN"
    assert label_of("ours-1gnn") == "Ours (1-GNN)"
    assert label_of("centralized-sage") == "Centralized SAGE"
    assert label_of("ours-star") == "ours*" and label_of("ours-full") == "ours-full"
    assert label_of("fedavg-nc") == "FedAvg+NC (20%)"
    assert label_of("fedgcn") == "FedGCN 2-hop (GCN)" and label_of("fedgcn-0hop", "sage") == \
        "FedGCN 0-hop (SAGE)"
    assert label_of("fedsage-plus") == "FedSage+ (GCN)"
    assert label_of("not-in-catalog") == "not-in-catalog"  # a plan written by an older study


def test_labels_name_the_backbone_every_run_took():
    # paper_configs.py ... -- --backbone sage: the rows say SAGE, not the catalog's GCN
    assert label_of("ours", "sage") == "Ours (SAGE)"
    assert label_of("centralized", "sage") == "Centralized SAGE"
    assert label_of("fedavg", "1gnn") == "FedAvg+1-GNN"
    assert label_of("bns") == "BNS-GCN" and label_of("bns", "sage") == "BNS-SAGE"
    assert label_of("ours-secure", "sage") == "Ours (SAGE, --secure)"
    assert label_of("ours-1gnn", "sage") == "Ours (1-GNN)"  # the method's own flag wins
    assert label_of("ours-star", "sage") == "ours*"


def test_sections_name_catalog_methods_only():
    assert set(SECTION_METHODS) == set(SECTIONS)
    for section in SECTIONS:
        assert methods_of(section) and all(m in METHODS for m in methods_of(section)), section
    assert REFERENCE_METHOD in METHODS and not METHODS[REFERENCE_METHOD].distributed
    assert methods_of("table2")[0] == "ours" and len(methods_of("table2")) == 16
    for section in ("fig3", "fig4"):  # beside FedAvg and FedAvg+NC in the local-bias figures
        assert {"fedavg", "fedavg-nc", "fedgcn", "fedgcn-0hop", "fedsage-plus", "llcg"} <= \
            set(methods_of(section)), section
    assert methods_of("table5") == ("ours-full", "ours-star", "ours")


def test_variants_share_their_algorithm():
    assert algo_of("ours-full") == algo_of("ours-star") == algo_of("ours-1gnn") == "ours"
    assert algo_of("centralized-1gnn") == "centralized"
    assert METHODS["ours-full"].flags == ("--sampling", "none")
    assert METHODS["ours"].distributed and not METHODS["graphsage"].distributed

