"""The study's one method catalog: every method is a valid mpifgl.train invocation with a label,
every section's rows come from it, and the study's modules import in one direction."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpifgl.methods import get_method
from mpifgl.config import parse_config
from study.catalog import (METHODS, REFERENCE_METHOD, SECTION_METHODS, SECTIONS, algo_of,
                           label_of, methods_of)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_is_a_valid_training_with_a_label(name):
    method = METHODS[name]
    assert method.name == name and method.label.strip()
    assert get_method(method.algo).name == method.algo
    config = parse_config(["--algo", method.algo, *method.flags])  # exit 2 on an unknown flag
    assert config.algo == method.algo


def test_labels_are_unique_and_match_the_report_tables():
    labels = [m.label for m in METHODS.values()]
    assert len(labels) == len(set(labels))
    assert label_of("ours-star") == "ours*" and label_of("ours-full") == "ours-full"
    assert label_of("fedavg-nc") == "FedAvg+NC (20%)"
    assert label_of("not-in-catalog") == "not-in-catalog"  # a plan written by an older study


def test_sections_name_catalog_methods_only():
    assert set(SECTION_METHODS) == set(SECTIONS)
    for section in SECTIONS:
        assert methods_of(section) and all(m in METHODS for m in methods_of(section)), section
    assert REFERENCE_METHOD in METHODS and not METHODS[REFERENCE_METHOD].distributed
    assert methods_of("table2")[0] == "ours" and len(methods_of("table2")) == 9
    assert methods_of("table5") == ("ours-full", "ours-star", "ours")


def test_variants_share_their_algorithm():
    assert algo_of("ours-full") == algo_of("ours-star") == algo_of("ours-1gnn") == "ours"
    assert algo_of("centralized-1gnn") == "centralized"
    assert METHODS["ours-full"].flags == ("--sampling", "none")
    assert METHODS["ours"].distributed and not METHODS["graphsage"].distributed


def _imports(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_imports_point_one_way():
    """catalog <- config <- plan <- runner; catalog <- report; nothing outside imports study."""
    study = {p.stem: _imports(p) for p in (REPO / "study").glob("*.py")}
    assert not any(m.startswith("study") for m in study["catalog"])
    assert not {"study.runner", "study.plan", "study.config", "study.__main__"} & study["report"]
    assert not {"study.runner", "study.report", "study.__main__"} & study["plan"]
    assert "study.__main__" not in set().union(*study.values())
    for package in ("mpifgl", "data_prep", "fgl_common"):
        for path in (REPO / package).rglob("*.py"):
            assert not any(m == "study" or m.startswith("study.") for m in _imports(path)), path
