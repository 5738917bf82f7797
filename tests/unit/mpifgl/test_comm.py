"""mpifgl.comm without starting MPI: MPICommunicator provides every member of the Communicator
Protocol with its signature (read from the source; tests/mpi/test_comm.py runs it)."""
from __future__ import annotations

import ast

from tests.helpers import REPO
from tests.helpers.communicator import protocol_members

COMM_SOURCE = REPO / "mpifgl" / "comm.py"
COMMUNICATOR_SOURCE = REPO / "mpifgl" / "communicator.py"
BASES_IN_COMMUNICATOR = {"TrafficCounters"}


def class_members(source, name: str) -> tuple[set[str], dict[str, list[str]]]:
    """(attribute names, method name -> parameter names) of class ``name`` in ``source``, with
    those of its bases defined in mpifgl/communicator.py, read without importing anything."""
    tree = ast.parse(source.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    attributes, methods = set(), {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in BASES_IN_COMMUNICATOR:
            base_attributes, base_methods = class_members(COMMUNICATOR_SOURCE, base.id)
            attributes |= base_attributes
            methods.update(base_methods)
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            methods[node.name] = [a.arg for a in node.args.args]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            attributes.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):  # self.x = ... in any method
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            attributes.add(node.attr)
    return attributes, methods


def mpi_class_members() -> tuple[set[str], dict[str, list[str]]]:
    """The members of mpifgl.comm.MPICommunicator, read from the source so that the test does
    not initialise MPI."""
    return class_members(COMM_SOURCE, "MPICommunicator")


def test_mpi_communicator_provides_every_member_with_the_protocols_signature():
    attributes, methods = protocol_members()
    mpi_attributes, mpi_methods = mpi_class_members()
    assert not attributes - mpi_attributes - set(mpi_methods), "MPICommunicator lacks " \
        f"{sorted(attributes - mpi_attributes - set(mpi_methods))}"
    for name, parameters in methods.items():
        assert name in mpi_methods, f"MPICommunicator lacks {name}()"
        assert mpi_methods[name] == parameters, name
