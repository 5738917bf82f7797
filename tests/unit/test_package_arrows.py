"""The import invariants, by an AST scan (no import runs, no subprocess):

    fgl_common <- data_prep        fgl_common <- mpifgl        data_prep -/- mpifgl
    study -> mpifgl (its catalog), nothing imports study

only mpifgl/comm.py imports mpi4py; what importing a module runs (its module-level imports,
followed through our own packages) loads no mpi4py for the model side, no PyG or torch for
data_prep, and no torch for the study's driver and report. tests/e2e/test_imports.py checks the
same in a fresh interpreter, third-party packages included.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

from tests.helpers import REPO


OUR_PACKAGES = ("fgl_common", "data_prep", "mpifgl", "study")


# keyed on the text, not the path: a file written again is scanned again; every test here
# scans the same packages, so each file is parsed and walked once per session
@lru_cache(maxsize=None)
def parsed(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path``, function-level ones included."""
    return set(_imported_packages(path.read_text(), str(path)))


@lru_cache(maxsize=None)
def _imported_packages(text: str, filename: str) -> frozenset[str]:
    packages = set()
    for node in ast.walk(parsed(text, filename)):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return frozenset(packages)


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


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import in ``path`` (``from a import b`` gives ``a``)."""
    return set(_imported_modules(path.read_text(), str(path)))


@lru_cache(maxsize=None)
def _imported_modules(text: str, filename: str) -> frozenset[str]:
    modules = set()
    for node in ast.walk(parsed(text, filename)):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return frozenset(modules)


def _runs_at_import(statements: list[ast.stmt]):
    """The import statements among ``statements`` that run when the module is imported: not in
    a function body, not under ``if TYPE_CHECKING:``."""
    for node in statements:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _runs_at_import(node.body)
            yield from _runs_at_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                yield from _runs_at_import(block)
        elif isinstance(node, (ast.ClassDef, ast.With)):
            yield from _runs_at_import(node.body)


def source_of(module: str, root: Path = REPO) -> Path | None:
    """The file of one of our modules (a package's __init__.py), None for a third-party one."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def loaded_at_import(module: str, root: Path = REPO) -> set[str]:
    """Every module importing ``module`` loads: the closure of the module-level imports through
    our own packages (parent packages' __init__ included); third-party ones as named."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # a.b.c imports a, a.b, a.b.c
            prefix = ".".join(parts[:k])
            if prefix in seen:
                continue
            seen.add(prefix)
            path = source_of(prefix, root)
            if path is None:
                continue
            for node in _runs_at_import(parsed(path.read_text(), str(path)).body):
                if isinstance(node, ast.Import):
                    todo += [a.name for a in node.names]
                elif node.level == 0 and node.module:
                    todo.append(node.module)
                    todo += [f"{node.module}.{a.name}" for a in node.names
                             if source_of(f"{node.module}.{a.name}", root)]
    return seen


def test_only_comm_imports_mpi4py():
    offenders = [str(p.relative_to(REPO)) for package in OUR_PACKAGES
                 for p in sorted((REPO / package).rglob("*.py"))
                 if "mpi4py" in imported_packages(p) and p != REPO / "mpifgl" / "comm.py"]
    assert offenders == []
    assert "mpi4py" in imported_packages(REPO / "mpifgl" / "comm.py")  # the scan sees it


@pytest.mark.parametrize("modules,forbidden", [
    (["mpifgl.model", "mpifgl.graph", "mpifgl.sampling", "mpifgl.trainer", "mpifgl.exchange",
      "mpifgl.communicator", "mpifgl.secure", "fgl_common.shard_format"], {"mpi4py"}),
    (["data_prep.__main__", "data_prep.api", "data_prep.verify"],
     {"mpi4py", "torch_geometric", "torch", "ogb"}),
    (["mpifgl.bias", "mpifgl.plot", "study.report", "study.runner", "study.__main__"],
     {"mpi4py", "torch"}),
])
def test_importing_loads_no_heavy_or_mpi_package(modules, forbidden):
    for module in modules:
        assert source_of(module) is not None, module
        loaded = {name.split(".")[0] for name in loaded_at_import(module)}
        assert not loaded & forbidden, f"importing {module} loads {sorted(loaded & forbidden)}"


def test_the_import_scan_follows_packages_and_skips_functions_and_type_checking(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("import json\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom pkg import b\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n"
        "def f():\n    import mpi4py\n")
    (package / "b.py").write_text("import scipy.sparse\n")
    loaded = loaded_at_import("pkg.a", tmp_path)
    assert {"pkg", "json", "pkg.a", "pkg.b", "scipy", "scipy.sparse", "numpy"} <= loaded
    assert not loaded & {"torch", "mpi4py"}


def test_study_imports_point_one_way():
    """catalog <- config <- plan <- runner; catalog <- report; nothing outside imports study."""
    study = {p.stem: imported_modules(p) for p in (REPO / "study").glob("*.py")}
    assert not any(m.startswith("study") for m in study["catalog"])
    assert not {"study.runner", "study.plan", "study.config", "study.__main__"} & study["report"]
    assert not {"study.runner", "study.report", "study.__main__"} & study["plan"]
    assert "study.__main__" not in set().union(*study.values())
    for package in ("mpifgl", "data_prep", "fgl_common"):
        for path in (REPO / package).rglob("*.py"):
            assert not any(m == "study" or m.startswith("study.") for m in imported_modules(path)), path
