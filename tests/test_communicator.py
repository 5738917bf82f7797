"""The one communicator interface (mpifgl.communicator.Communicator): both implementations provide
every member with the Protocol's signature, and the one-process world's collectives give what
MPI's give with one rank. No MPI here: the MPI class is read from its source."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from mpifgl.communicator import (SERVER_RANK, Communicator, LocalComm, client_of_rank,
                                 rank_of_client)

COMM_SOURCE = Path(__file__).resolve().parents[1] / "mpifgl" / "comm.py"


def protocol_members() -> tuple[set[str], dict[str, list[str]]]:
    """(attribute names, method name -> parameter names) of the Protocol."""
    attributes = set(Communicator.__annotations__)
    methods = {name: list(inspect.signature(value).parameters)
               for name, value in vars(Communicator).items()
               if inspect.isfunction(value) and not name.startswith("_")}
    return attributes, methods


def mpi_class_members() -> tuple[set[str], dict[str, list[str]]]:
    """(attribute names, method name -> parameter names) of mpifgl.comm.MPICommunicator, read
    from the source so that the test does not initialise MPI."""
    tree = ast.parse(COMM_SOURCE.read_text())
    cls = next(node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "MPICommunicator")
    attributes, methods = set(), {}
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


def test_the_protocol_lists_what_the_program_calls():
    attributes, methods = protocol_members()
    assert {"rank", "size", "client_id", "is_server", "is_client", "num_clients",
            "is_single_process", "bytes_sent", "exchange_bytes_received"} <= attributes
    assert {"gatherv", "scatterv", "reduce_sum", "sum_to_all", "agree_on_errors",
            "wait_for_server", "abort", "counting_exchange"} <= set(methods)


def test_local_comm_provides_every_member_with_the_protocols_signature():
    attributes, methods = protocol_members()
    comm = LocalComm()
    assert isinstance(comm, Communicator)
    missing = [name for name in attributes | set(methods) if not hasattr(comm, name)]
    assert not missing, f"LocalComm lacks {missing}"
    for name, parameters in methods.items():
        assert list(inspect.signature(getattr(LocalComm, name)).parameters) == parameters, name


def test_mpi_communicator_provides_every_member_with_the_protocols_signature():
    attributes, methods = protocol_members()
    mpi_attributes, mpi_methods = mpi_class_members()
    assert not attributes - mpi_attributes - set(mpi_methods), "MPICommunicator lacks " \
        f"{sorted(attributes - mpi_attributes - set(mpi_methods))}"
    for name, parameters in methods.items():
        assert name in mpi_methods, f"MPICommunicator lacks {name}()"
        assert mpi_methods[name] == parameters, name


def test_rank_and_client_ids_map_one_to_one():
    assert client_of_rank(SERVER_RANK) == -1
    assert [rank_of_client(client_of_rank(r)) for r in range(1, 5)] == [1, 2, 3, 4]


def test_local_comm_is_server_and_only_client():
    comm = LocalComm()
    assert (comm.rank, comm.size, comm.client_id, comm.num_clients) == (0, 1, 0, 1)
    assert comm.is_server and comm.is_client and comm.is_single_process


def test_local_comm_buffer_collectives_are_those_of_one_rank():
    comm = LocalComm()
    send = np.arange(6, dtype=np.float32).reshape(3, 2)
    gathered = comm.gatherv(send, np.asarray([6]))
    assert gathered.dtype == np.float32 and gathered.tolist() == list(range(6))
    assert comm.gatherv(send, None).shape == (6,)
    with pytest.raises(ValueError, match="expected \\[6\\]"):
        comm.gatherv(send, np.asarray([4]))
    received = comm.scatterv(gathered, np.asarray([6]), 6, np.float64)
    assert received.dtype == np.float64 and received.tolist() == list(range(6))
    with pytest.raises(ValueError, match="receive count 5"):
        comm.scatterv(gathered, np.asarray([6]), 5, np.float32)
    buffer = np.ones((2, 2))
    assert comm.reduce_sum(buffer) is buffer  # summed in place, as at MPI's root
    assert comm.gather_equal(send).shape == (1, 3, 2)
    ids = comm.broadcast_array(np.asarray([3, 1], dtype=np.int32))
    assert ids.dtype == np.int64 and ids.tolist() == [3, 1]


def test_local_comm_sums_and_gathers_return_fresh_arrays():
    comm = LocalComm()
    values = np.asarray([1.5, 2.0])
    for result in (comm.sum_to_all(values), comm.sum_to_server(values)):
        assert result.tolist() == [1.5, 2.0] and result is not values
    assert comm.gather_rows(np.asarray([1, 2])).tolist() == [[1.0, 2.0]]
    table = comm.allgather_rows(np.asarray([4, 5]))
    assert table.dtype == np.int64 and table.shape == (1, 2)
    rows = np.zeros((3, 2))
    assert [r.shape for r in comm.gatherv_rows(rows)] == [(3, 2)]


def test_local_comm_objects_errors_and_abort():
    comm = LocalComm()
    assert comm.broadcast_object({"a": 1}) == {"a": 1}
    assert comm.gather_objects(7) == [7]
    assert comm.scatter_objects([8]) == 8
    with pytest.raises(ValueError, match="needs one value"):
        comm.scatter_objects([1, 2])
    assert comm.agree_on_errors(None) == []
    assert comm.agree_on_errors("bad") == [(0, 0, "bad")]
    comm.wait_for_server()  # nobody to wait for
    with pytest.raises(SystemExit) as exit_info:
        comm.abort(3)
    assert exit_info.value.code == 3


def test_local_comm_counts_no_traffic():
    comm = LocalComm()
    with comm.counting_exchange():
        comm.gatherv(np.ones(4), np.asarray([4]))
        comm.sum_to_all(np.ones(3))
    comm.reset_counters()
    assert (comm.seconds, comm.bytes_sent, comm.bytes_received, comm.exchange_bytes_sent,
            comm.exchange_bytes_received) == (0.0, 0, 0, 0, 0)
