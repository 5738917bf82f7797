"""mpifgl.communicator: the Communicator Protocol lists what the program calls, and LocalComm
(the one-process world) implements every member with the Protocol's signature and gives what
MPI's collectives give with one rank (tests/mpi/test_comm.py runs the MPI ones)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from mpifgl.communicator import (SERVER_RANK, Communicator, LocalComm, client_of_rank,
                                 rank_of_client)
from tests.helpers.communicator import protocol_members
from tests.helpers.thread_comm import ThreadWorld


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


def test_rank_and_client_ids_map_one_to_one():
    assert client_of_rank(SERVER_RANK) == -1
    assert [rank_of_client(client_of_rank(r)) for r in range(1, 5)] == [1, 2, 3, 4]


def test_local_comm_is_server_and_only_client():
    comm = LocalComm()
    assert (comm.rank, comm.size, comm.client_id, comm.num_clients) == (0, 1, 0, 1)
    assert comm.is_server and comm.is_client and comm.is_single_process


def test_local_comm_buffer_collectives_are_those_of_one_rank():
    comm = LocalComm()
    send = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    gathered = comm.gatherv(send, np.asarray([6]))
    assert gathered.dtype == torch.float32 and gathered.tolist() == list(range(6))
    assert comm.gatherv(send, None).shape == (6,)
    with pytest.raises(ValueError, match="expected \\[6\\]"):
        comm.gatherv(send, np.asarray([4]))
    received = comm.scatterv(gathered, np.asarray([6]), 6, torch.float64)
    assert received.dtype == torch.float64 and received.tolist() == list(range(6))
    with pytest.raises(ValueError, match="receive count 5"):
        comm.scatterv(gathered, np.asarray([6]), 5, torch.float32)
    buffer = torch.ones((2, 2))
    assert comm.reduce_sum(buffer) is buffer  # summed in place, as at MPI's root
    assert comm.gather_equal(send).shape == (1, 3, 2)
    ids = comm.broadcast_array(torch.tensor([3, 1], dtype=torch.int32))
    assert ids.dtype == torch.int64 and ids.tolist() == [3, 1]


def test_local_comm_sums_and_gathers_return_fresh_tensors():
    comm = LocalComm()
    values = torch.tensor([1.5, 2.0], dtype=torch.float64)
    for result in (comm.sum_to_all(values), comm.sum_to_all(values, [1, 1]),
                   comm.sum_to_server(values)):
        assert result.tolist() == [1.5, 2.0] and result is not values
    assert comm.gather_rows(torch.tensor([1, 2])).tolist() == [[1.0, 2.0]]
    table = comm.allgather_rows(torch.tensor([4, 5]))
    assert table.dtype == torch.int64 and table.shape == (1, 2)
    rows = torch.zeros((3, 2))
    assert [r.shape for r in comm.gatherv_rows(rows)] == [(3, 2)]
    assert comm.max_to_all(torch.tensor([3])).tolist() == [3]
    assert comm.extra_counters() == {}


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
        comm.gatherv(torch.ones(4), np.asarray([4]))
        comm.sum_to_all(torch.ones(3))
    comm.reset_counters()
    assert (comm.seconds, comm.bytes_sent, comm.bytes_received, comm.exchange_bytes_sent,
            comm.exchange_bytes_received) == (0.0, 0, 0, 0, 0)


def test_local_comm_groups_are_of_one_rank():
    comm = LocalComm()
    group = comm.split(0, 5)
    assert (group.rank, group.size) == (0, 1) and comm.split(-1, 0) is None
    buffer = torch.ones(3)
    assert group.broadcast_buffer(buffer, 0) is buffer and group.allreduce_sum(buffer) is buffer
    with pytest.raises(ValueError, match="from rank 1 in a world of one rank"):
        group.broadcast_buffer(buffer, 1)


def test_split_groups_in_threads_count_into_their_parent():
    """Ranks 1..4 split by parity and ordered by descending rank: each group broadcasts from
    its rank 0 and sums; its bytes (logical payload: the root sends size - 1 copies, an
    allreduce sends and receives its buffer) are the parent's too; rank 0 is in none."""
    def body(comm):
        group = comm.split(comm.rank % 2 if comm.is_client else -1, -comm.rank)
        if group is None:
            return None
        value = torch.full((2,), float(comm.rank), dtype=torch.float64)
        root = group.broadcast_buffer(value.clone(), root=0)
        total = group.allreduce_sum(value.clone())
        return (group.rank, group.size, root.tolist(), total.tolist(),
                (comm.bytes_sent, comm.bytes_received))

    found = ThreadWorld(5).run(body)
    assert found[0] is None
    assert found[3] == (0, 2, [3.0, 3.0], [4.0, 4.0], (16 + 16, 16))  # odd: 3 then 1
    assert found[1] == (1, 2, [3.0, 3.0], [4.0, 4.0], (16, 16 + 16))
    assert found[4][:4] == (0, 2, [4.0, 4.0], [6.0, 6.0])
