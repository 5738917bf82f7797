"""Raw files stored as Python pickles (Planetoid's ``ind.<name>.*``), checked before a loader
unpickles them: unpickling calls whatever the file names, so a crafted file could run code.

The check reads the pickle's opcodes (``pickletools``: nothing is built or called) and accepts
only the few objects the real files build: numpy arrays and dtypes, scipy CSR matrices, a
defaultdict of lists. Anything else, or an object named in a way the scan cannot follow, is
refused with the file's name.

Plain standard library: no numpy, no torch.
"""
from __future__ import annotations

import pickletools
from pathlib import Path

# (module, name) of every object a Planetoid raw file builds, in the spellings of the numpy,
# scipy and Python versions that wrote or read them
PLANETOID_OBJECTS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("scipy.sparse.csr", "csr_matrix"),
    ("scipy.sparse._csr", "csr_matrix"), ("collections", "defaultdict"),
    ("__builtin__", "list"), ("builtins", "list")})
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
               "BINSTRING", "STRING"}
_NAMING_OPS = {"GLOBAL", "INST", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4"}


def pickled_objects(data: bytes) -> list[tuple[str, str] | None]:
    """Every (module, name) the pickle ``data`` would import and call, in order; None for one
    it names in a way a scan cannot tell (an extension code, a name computed on the stack).
    ValueError for data that is not a pickle."""
    found: list[tuple[str, str] | None] = []
    strings: list[str] = []  # the strings on top of the stack (at most 2), for STACK_GLOBAL
    memo: dict[int, str | None] = {}  # the strings memoized, by index (others: None)
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in _STRING_OPS:
                strings = (strings + [arg])[-2:]
            elif op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if op.name == "MEMOIZE" else int(arg)] = \
                    strings[-1] if strings else None
                continue  # the stack is unchanged
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                value = memo.get(int(arg))
                strings = (strings + [value])[-2:] if value is not None else []
                continue
            elif op.name in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                found.append((module, name))
            elif op.name == "STACK_GLOBAL":
                found.append(tuple(strings) if len(strings) == 2 else None)  # type: ignore
            elif op.name in _NAMING_OPS:
                found.append(None)
            if op.name not in _STRING_OPS:
                strings = []
    except Exception as exc:  # pickletools raises ValueError and others on damaged data
        raise ValueError(f"not a readable pickle ({exc})") from None
    return found


def check_pickled_file(path: Path, allowed: frozenset[tuple[str, str]], shown: Path) -> None:
    """ValueError naming ``shown`` (the user's copy of ``path``) when the pickle in ``path``
    would build anything outside ``allowed``."""
    try:
        objects = pickled_objects(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{shown}: {exc}") from None
    foreign = sorted({"an object the scan cannot name" if o is None else f"{o[0]}.{o[1]}"
                      for o in objects if o not in allowed})
    if foreign:
        raise ValueError(f"{shown}: refused: unpickling it would call {', '.join(foreign)}, "
                         f"which could run code; the original file builds numpy arrays, scipy "
                         f"matrices and lists only: replace it with the dataset's own file")
