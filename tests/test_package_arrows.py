"""Plain pytest: the imports between the packages point one way (an AST scan, no import runs).

    fgl_common <- data_prep        fgl_common <- mpifgl        data_prep -/- mpifgl
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path``, function-level ones included."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


@pytest.mark.parametrize("package,forbidden", [
    ("fgl_common", {"data_prep", "mpifgl", "study"}),
    ("data_prep", {"mpifgl", "study"}),
    ("mpifgl", {"data_prep", "study"}),
])
def test_imports_point_one_way(package, forbidden):
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    offenders = {str(p.relative_to(REPO)): sorted(imported_packages(p) & forbidden)
                 for p in files if imported_packages(p) & forbidden}
    assert offenders == {}


def test_the_scan_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from data_prep.api import prepare_shards\n    import mpifgl\n")
    assert imported_packages(module) == {"data_prep", "mpifgl"}
