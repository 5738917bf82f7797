"""Nothing the programs load can run code (docs/reliability.md), by an AST scan of every
package: each ``torch.load`` passes ``weights_only=True``, no ``np.load`` allows pickles, and
no module unpickles a file itself (``pickle.load``, ``pickle.loads``, ``pickle.Unpickler``)."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGES = ("fgl_common", "data_prep", "mpifgl", "study", "benchmarks")


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a call's function (empty for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def loads_that_may_run_code(path: Path) -> list[str]:
    """``file:line: what`` for every load in ``path`` that could run code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        shown = path.relative_to(REPO) if REPO in path.parents else path.name
        name, where = _name(node.func), f"{shown}:{node.lineno}"
        if name == "torch.load":
            flag = _keyword(node, "weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                found.append(f"{where}: torch.load without weights_only=True")
        elif name in ("np.load", "numpy.load"):
            flag = _keyword(node, "allow_pickle")
            if flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False):
                found.append(f"{where}: np.load with allow_pickle")
        elif name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "torch.serialization"
                      ".add_safe_globals"):
            found.append(f"{where}: {name}")
    return found


def test_no_package_loads_what_could_run_code():
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    assert len(files) > 50
    assert [line for p in files for line in loads_that_may_run_code(p)] == []


def test_the_scan_sees_each_kind(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import torch, pickle, numpy as np\n"
                      "torch.load(p)\ntorch.load(p, weights_only=False)\n"
                      "torch.load(p, weights_only=True)\nnp.load(p, allow_pickle=True)\n"
                      "np.load(p)\npickle.loads(b)\n")
    assert loads_that_may_run_code(module) == [
        "m.py:2: torch.load without weights_only=True",
        "m.py:3: torch.load without weights_only=True", "m.py:5: np.load with allow_pickle",
        "m.py:7: pickle.loads"]
