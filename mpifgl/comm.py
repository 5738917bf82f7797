"""Every MPI call of the program. The only module that imports mpi4py.

Rank 0 is the server; rank r >= 1 serves client r - 1 (``client_of_rank``). Hot-loop calls use
upper-case buffer collectives on contiguous host tensors (passed to MPI as numpy views, no copy);
lower-case (pickled) calls are used only for set-up metadata, checkpoints and errors.

Traffic is counted as logical payload per rank: what a rank contributes to a collective is
"sent", what it gets back is "received", whatever tree or ring MPI uses underneath.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from fgl_common.launch import RUNTIME_TUNING

# Open MPI reads these when mpi4py initialises MPI just below (MPICH ignores them): the
# non-blocking reduce / broadcast algorithms of the exchange (docs/training.md); environment wins.
for _name, _value in RUNTIME_TUNING.items():
    os.environ.setdefault(_name, _value)

from mpi4py import MPI  # noqa: E402

from fgl_common.arrays import offsets  # noqa: E402
from mpifgl.communicator import (SERVER_RANK, TrafficCounters, allreduce_traffic,  # noqa: E402
                                 broadcast_traffic, client_of_rank)
from mpifgl.watchdog import Stall, Watchdog  # noqa: E402

ABORT_PAUSE_SECONDS = 0.2


MPI_TYPES = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
             torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T,
             # --secure: masked values in the rings Z_2^32 / Z_2^64 (MPI_SUM wraps unsigned)
             torch.uint32: MPI.UINT32_T, torch.uint64: MPI.UINT64_T}
MAX_MPI_COUNT = 2 ** 31 - 1  # MPI's int counts and displacements
# --wire-dtype: 16-bit floats move as their bits (MPI has no bfloat16), so only through the
# collectives that copy (gathers, scatters), never through a reduction
RAW_16_BIT = (torch.bfloat16, torch.float16)


def _checked_counts(counts: np.ndarray) -> np.ndarray:
    """Element counts of one collective, refused when a count or displacement would overflow
    MPI's int (callers chunk their buffers so this never fires)."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size and (int(counts.sum()) > MAX_MPI_COUNT or int(counts.min()) < 0):
        raise ValueError(f"collective of {int(counts.sum())} elements: counts and displacements "
                         f"must lie in [0, {MAX_MPI_COUNT}]; lower --exchange-buffer-mb")
    return counts


def _displacements(counts: np.ndarray) -> np.ndarray:
    return offsets(counts)[:-1]


def _buffer(tensor: torch.Tensor, copied: bool = False) -> tuple[np.ndarray, "MPI.Datatype"]:
    """A host tensor as MPI's [buffer, type]: a numpy view of its contiguous memory. ``copied``:
    the collective only moves the values, so 16-bit floats may travel as their bits."""
    if tensor.device.type != "cpu":
        raise ValueError(f"an MPI buffer on {tensor.device}: copy it to host memory first")
    if copied and tensor.dtype in RAW_16_BIT:
        return _array(tensor.contiguous()), MPI.INT16_T
    if tensor.dtype not in MPI_TYPES:
        raise ValueError(f"an MPI buffer of {tensor.dtype}, expected one of "
                         f"{', '.join(str(t) for t in MPI_TYPES)}")
    return tensor.contiguous().numpy(), MPI_TYPES[tensor.dtype]


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous host tensor; a 16-bit float's as int16 bits."""
    return tensor.view(torch.int16).numpy() if tensor.dtype in RAW_16_BIT else tensor.numpy()


class MPICommunicator(TrafficCounters):
    """``mpifgl.communicator.Communicator`` over one MPI communicator, counted.

    The hot-loop collectives are started non-blocking and waited on at once: same result, but
    Open MPI then runs its faster libnbc algorithms instead of the blocking "tuned" ones
    (docs/training.md; benchmarks/bench_train.py measures the whole epoch).

    Every call that waits for other ranks is marked on ``watchdog`` (mpifgl.watchdog), which a
    communicator split from this one shares: pass ``watchdog=parent.watchdog`` and a ``name``
    for the line that reports a stall ("row 2")."""

    is_single_process = False  # even at size 1: rank 0 is then a server without clients

    def __init__(self, comm: "MPI.Comm | None" = None, watchdog: Watchdog | None = None,
                 name: str = "the world"):
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.watchdog = watchdog if watchdog is not None else Watchdog()
        self.name = name
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.client_id = client_of_rank(self.rank)
        self.num_clients = self.size - 1
        self.is_server = self.rank == SERVER_RANK
        self.is_client = not self.is_server
        self._counting_exchange = False
        self._node: "MPI.Comm | None" = None  # the ranks of this node, split on first use
        self._leaders: "tuple[MPI.Comm, MPI.Comm | None] | None" = None  # _host_groups
        # once, at start-up: messages and config.json name each rank's host
        self.hosts = self.comm.allgather(MPI.Get_processor_name())
        self.reset_counters()

    # -- accounting ------------------------------------------------------------------------
    def reset_counters(self) -> None:
        super().reset_counters()
        self.collectives = 0  # each one at least a latency of the slowest link it crosses

    def extra_counters(self) -> dict[str, int]:
        """The buffer collectives since reset_counters (the server takes part in every one)."""
        return {"collectives": self.collectives}

    def _timed(self, start_collective, *args) -> None:
        """Run one non-blocking collective to completion, counting it and its wall time; the
        watchdog sees the wait."""
        self.collectives += 1
        watchdog = self.watchdog
        watchdog.wait = (self.name, start_collective)
        start = time.perf_counter()
        try:
            start_collective(*args).Wait()
        finally:
            watchdog.wait = None
            self.seconds += time.perf_counter() - start

    def _waiting(self, call: Callable, *args, **kwargs) -> Any:
        """A blocking call that waits for other ranks (pickled collectives, splits), seen by the
        watchdog like the buffer collectives; not counted as traffic."""
        self.watchdog.wait = (self.name, call)
        try:
            return call(*args, **kwargs)
        finally:
            self.watchdog.wait = None

    # -- buffer collectives with counts (the cross-client exchange, mpifgl.exchange) ----------
    @contextmanager
    def counting_exchange(self):
        """Inside this block, traffic is also counted as the cross-client exchange's."""
        self._counting_exchange = True
        try:
            yield
        finally:
            self._counting_exchange = False

    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += int(sent)
        self.bytes_received += int(received)
        if self._counting_exchange:
            self.exchange_bytes_sent += int(sent)
            self.exchange_bytes_received += int(received)

    def gatherv(self, send: torch.Tensor, counts: np.ndarray | None) -> torch.Tensor | None:
        """Every rank's 1-D or 2-D buffer end to end at the server. ``counts``: int64 [size],
        elements per rank, given at the server only (the server's own entry included). Returns
        the flat concatenation [sum(counts)] at the server, None elsewhere."""
        buffer, mpi_type = _buffer(send, copied=True)
        if not self.is_server:
            self._timed(self.comm.Igatherv, [buffer, mpi_type], None, SERVER_RANK)
            self._count(buffer.nbytes, 0)
            return None
        counts = _checked_counts(counts)
        gathered = torch.empty(int(counts.sum()), dtype=send.dtype)
        self._timed(self.comm.Igatherv, [buffer, mpi_type],
                    [_array(gathered), (counts, _displacements(counts)), mpi_type], SERVER_RANK)
        self._count(0, gathered.nbytes - buffer.nbytes)
        return gathered

    def scatterv(self, send: torch.Tensor | None, counts: np.ndarray | None, receive_count: int,
                 dtype: torch.dtype) -> torch.Tensor:
        """The server's flat ``send`` cut into ``counts`` (int64 [size], elements per rank,
        server only); every rank gets its ``receive_count`` elements, flat."""
        received = torch.empty(int(receive_count), dtype=dtype)
        target = [_array(received), MPI.INT16_T if dtype in RAW_16_BIT else MPI_TYPES[dtype]]
        if self.is_server:
            counts = _checked_counts(counts)
            buffer, mpi_type = _buffer(send, copied=True)
            self._timed(self.comm.Iscatterv, [buffer, (counts, _displacements(counts)), mpi_type],
                        target, SERVER_RANK)
            self._count(int(counts.sum()) * buffer.itemsize - received.nbytes, 0)
        else:
            self._timed(self.comm.Iscatterv, None, target, SERVER_RANK)
            self._count(0, received.nbytes)
        return received

    def reduce_sum(self, buffer: torch.Tensor) -> torch.Tensor | None:
        """MPI_Reduce(SUM) of one buffer shape on every rank; the server's buffer is summed in
        place (IN_PLACE) and returned, None elsewhere. Other client ranks may add partial sums
        (a tree)."""
        buffer = buffer.contiguous()
        array, mpi_type = _buffer(buffer)
        _checked_counts(np.asarray([array.size]))
        if self.is_server:
            self._timed(self.comm.Ireduce, MPI.IN_PLACE, [array, mpi_type], MPI.SUM, SERVER_RANK)
            self._count(0, array.nbytes * (self.size - 1))
            return buffer
        self._timed(self.comm.Ireduce, [array, mpi_type], None, MPI.SUM, SERVER_RANK)
        self._count(array.nbytes, 0)
        return None

    def gather_equal(self, send: torch.Tensor) -> torch.Tensor | None:
        """MPI_Gather of one buffer shape from every rank -> [size, *shape] at the server."""
        array, mpi_type = _buffer(send)
        _checked_counts(np.asarray([array.size * self.size]))
        if self.is_server:
            gathered = torch.empty((self.size,) + tuple(send.shape), dtype=send.dtype)
            self._timed(self.comm.Igather, [array, mpi_type], [gathered.numpy(), mpi_type],
                        SERVER_RANK)
            self._count(0, array.nbytes * (self.size - 1))
            return gathered
        self._timed(self.comm.Igather, [array, mpi_type], None, SERVER_RANK)
        self._count(array.nbytes, 0)
        return None

    def broadcast_array(self, values: torch.Tensor | None) -> torch.Tensor:
        """The server's int64 1-D tensor on every rank (its length travels first)."""
        length = np.asarray([values.shape[0] if self.is_server else 0], dtype=np.int64)
        self._timed(self.comm.Ibcast, [length, MPI.INT64_T], SERVER_RANK)
        out = (values.to(torch.int64).contiguous() if self.is_server
               else torch.empty(int(length[0]), dtype=torch.int64))
        self._timed(self.comm.Ibcast, [out.numpy(), MPI.INT64_T], SERVER_RANK)
        if self.is_server:
            self._count((out.nbytes + length.nbytes) * (self.size - 1), 0)
        else:
            self._count(0, out.nbytes + length.nbytes)
        return out

    # -- small sums and gathers ------------------------------------------------------------
    def sum_to_all(self, values: torch.Tensor, segments: list[int] | None = None) -> torch.Tensor:
        """Sum a vector over ranks at the server, then broadcast the sum: every rank gets
        bit-identical values (unlike an Allreduce, where that is not guaranteed). Where the
        ranks run on several hosts, each host's ranks sum first and its first rank takes part
        for them, so a host's link carries the vector once each way, not once per rank."""
        array, mpi_type = _buffer(values)
        total = torch.empty_like(values)
        groups = self._host_groups()
        if groups is None:
            self._timed(self.comm.Ireduce, [array, mpi_type], [total.numpy(), mpi_type],
                        MPI.SUM, SERVER_RANK)
            self._timed(self.comm.Ibcast, [total.numpy(), mpi_type], SERVER_RANK)
        else:
            node, leaders = groups
            host_sum = torch.empty_like(values)
            self._timed(node.Ireduce, [array, mpi_type], [host_sum.numpy(), mpi_type], MPI.SUM, 0)
            if leaders is not None:  # the server leads its host: rank 0 of both groups
                self._timed(leaders.Ireduce, [host_sum.numpy(), mpi_type],
                            [total.numpy(), mpi_type], MPI.SUM, 0)
                self._timed(leaders.Ibcast, [total.numpy(), mpi_type], 0)
            self._timed(node.Ibcast, [total.numpy(), mpi_type], 0)
        if self.is_server:
            self._count(total.nbytes * (self.size - 1), array.nbytes * (self.size - 1))
        else:
            self._count(array.nbytes, total.nbytes)
        return total

    def sum_to_server(self, values: torch.Tensor) -> torch.Tensor | None:
        array, mpi_type = _buffer(values)
        total = torch.empty_like(values) if self.is_server else None
        self._timed(self.comm.Ireduce, [array, mpi_type],
                    [total.numpy(), mpi_type] if self.is_server else None, MPI.SUM, SERVER_RANK)
        if self.is_server:
            self._count(0, array.nbytes * (self.size - 1))
        else:
            self._count(array.nbytes, 0)
        return total

    def max_to_all(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum of an int64 vector over ranks, on every rank (--secure: the
        fixed-point range of a masked operation's first use)."""
        array, _ = _buffer(values.to(torch.int64))
        result = torch.empty(array.shape, dtype=torch.int64)
        self._timed(self.comm.Iallreduce, [array, MPI.INT64_T], [result.numpy(), MPI.INT64_T],
                    MPI.MAX)
        self._count(array.nbytes, result.nbytes)
        return result

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor | None:
        """Gather one fixed-length float64 row per rank at the server -> [size, k]."""
        array, _ = _buffer(row.to(torch.float64))
        table = torch.empty((self.size, array.shape[0]), dtype=torch.float64) \
            if self.is_server else None
        self._timed(self.comm.Igather, [array, MPI.DOUBLE],
                    [table.numpy(), MPI.DOUBLE] if self.is_server else None, SERVER_RANK)
        if self.is_server:
            self._count(0, array.nbytes * (self.size - 1))
        else:
            self._count(array.nbytes, 0)
        return table

    def allgather_rows(self, row: torch.Tensor) -> torch.Tensor:
        """Every rank's int64 vector, one length on all ranks -> [size, length] on every rank."""
        array, _ = _buffer(row.to(torch.int64))
        table = torch.empty((self.size, array.shape[0]), dtype=torch.int64)
        self._timed(self.comm.Iallgather, [array, MPI.INT64_T], [table.numpy(), MPI.INT64_T])
        self._count(array.nbytes, table.nbytes)
        return table

    def gatherv_rows(self, rows: torch.Tensor) -> list[torch.Tensor] | None:
        """Gather variable-length 2-D tensors of one dtype and width at the server (end of run):
        the row counts travel first, then the rows through ``gatherv``."""
        rows = rows.contiguous()
        width = rows.shape[1]
        counts = np.asarray(self._waiting(self.comm.gather, rows.shape[0], root=SERVER_RANK)
                            or [], np.int64)
        flat = self.gatherv(rows, counts * width if self.is_server else None)
        if flat is None:
            return None
        starts = offsets(counts) * width
        return [flat[starts[r]:starts[r + 1]].view(-1, width) for r in range(self.size)]

    # -- set-up, checkpoints, errors (pickled, rare) --------------------------------------------
    def broadcast_object(self, value: Any) -> Any:
        return self._waiting(self.comm.bcast, value, root=SERVER_RANK)

    def gather_objects(self, value: Any) -> list[Any] | None:
        return self._waiting(self.comm.gather, value, root=SERVER_RANK)

    def scatter_objects(self, values: list[Any] | None) -> Any:
        return self._waiting(self.comm.scatter, values, root=SERVER_RANK)

    def agree_on_errors(self, error: str | None) -> list[tuple[int, int, str]]:
        """Every rank learns every rank's set-up error (rank, client id, message), so all of
        them stop together."""
        errors = self._waiting(self.comm.allgather, error)
        return [(rank, client_of_rank(rank), message) for rank, message in enumerate(errors)
                if message]

    def node_allgather(self, value: Any) -> list[Any]:
        """Every value of the ranks sharing this rank's node, in their node order."""
        return self._node_comm().allgather(value)

    def _node_comm(self) -> "MPI.Comm":
        """The ranks of this rank's node, in world order (collective on first use)."""
        if self._node is None:
            self._node = self._waiting(self.comm.Split_type, MPI.COMM_TYPE_SHARED, key=self.rank)
        return self._node

    def _host_groups(self) -> "tuple[MPI.Comm, MPI.Comm | None] | None":
        """(this node's ranks, the first rank of every node, None off those) where the world
        spans several hosts, else None; made on first use, by every rank at once (the caller
        is a collective)."""
        if len(set(self.hosts)) < 2:
            return None
        if self._leaders is None:
            node = self._node_comm()
            leaders = self._waiting(self.comm.Split, 0 if node.Get_rank() == 0 else MPI.UNDEFINED,
                                    key=self.rank)
            self._leaders = (node, None if leaders == MPI.COMM_NULL else leaders)
        return self._leaders

    def wait_for_server(self, poll_seconds: float = 0.05) -> None:
        """A barrier that sleeps instead of spinning, so waiting clients leave the CPU to the
        server while it does long set-up work (e.g. preparing shards)."""
        self.watchdog.wait = (self.name, "barrier")
        try:
            request = self.comm.Ibarrier()
            while not request.Test():
                time.sleep(poll_seconds)
        finally:
            self.watchdog.wait = None

    def start_watchdog(self, timeout: Callable[[], float], report: Callable[[Stall], None]
                       ) -> None:
        """Start this process's watchdog (mpifgl.watchdog) with its own channel; collective on
        this communicator, which must be the world (the channel names world ranks). It stops
        before MPI is finalised."""
        self.watchdog.start(WatchdogChannel(self.comm), timeout, report)
        atexit.register(self.watchdog.stop)  # runs before mpi4py finalises MPI

    def abort(self, code: int = 1) -> None:
        """End the whole job from one rank (an exception must not leave the others hanging).
        The pause lets the launcher forward this rank's last message before Open MPI's own
        abort banner, which MPI_Abort always prints."""
        _abort_after_the_last_line(self.comm, code)

    # -- groups of ranks (CAGNET's row and column groups) ---------------------------------------
    def split(self, color: int, key: int) -> "GroupCommunicator | None":
        """MPI_Comm_split (collective, at set-up): the ranks of one ``color`` >= 0, ordered by
        ``key``; None for a negative color (MPI_UNDEFINED)."""
        group = self._waiting(self.comm.Split, color if color >= 0 else MPI.UNDEFINED, key)
        if group == MPI.COMM_NULL:
            return None
        return GroupCommunicator(group, self, f"group {color} of {self.name}")

    def broadcast_buffer(self, buffer: torch.Tensor, root: int) -> torch.Tensor:
        """MPI_Bcast of rank ``root``'s buffer into every rank's, in place (host memory, one
        shape and dtype everywhere)."""
        array, mpi_type = _buffer(_in_place(buffer, "broadcast_buffer"))
        _checked_counts(np.asarray([array.size]))
        self._timed(self.comm.Ibcast, [array, mpi_type], root)
        self._count(*broadcast_traffic(array.nbytes, self.size, self.rank == root))
        return buffer

    def allreduce_sum(self, buffer: torch.Tensor) -> torch.Tensor:
        """MPI_Allreduce(SUM) of one buffer shape, in place on every rank."""
        array, mpi_type = _buffer(_in_place(buffer, "allreduce_sum"))
        _checked_counts(np.asarray([array.size]))
        self._timed(self.comm.Iallreduce, MPI.IN_PLACE, [array, mpi_type], MPI.SUM)
        self._count(*allreduce_traffic(array.nbytes, self.size))
        return buffer


class WatchdogChannel:
    """The watchdog's messages (``mpifgl.watchdog.SideChannel``) on a copy of the world, so they
    never match the program's own traffic; only the monitor thread uses it (MPI_THREAD_MULTIPLE,
    which mpi4py asks for by default)."""

    TAG = 1

    def __init__(self, world_comm: "MPI.Comm"):
        self.world = world_comm
        self.comm = world_comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.hosts = self.comm.allgather(socket.gethostname())
        self._sending: list[tuple["MPI.Request", np.ndarray]] = []  # buffers live until sent

    def send(self, dest: int, message: np.ndarray) -> None:
        self._sending = [(r, m) for r, m in self._sending if not r.Test()]
        message = np.ascontiguousarray(message, dtype=np.float64)
        self._sending.append((self.comm.Isend([message, MPI.DOUBLE], dest, self.TAG), message))

    def receive(self) -> list[tuple[int, np.ndarray]]:
        found = []
        status = MPI.Status()
        while (message := self.comm.Improbe(MPI.ANY_SOURCE, self.TAG, status)) is not None:
            values = np.empty(status.Get_count(MPI.DOUBLE), dtype=np.float64)
            message.Recv([values, MPI.DOUBLE])
            found.append((status.Get_source(), values))
        return found

    def abort(self, code: int) -> None:
        _abort_after_the_last_line(self.world, code)


def _abort_after_the_last_line(comm: "MPI.Comm", code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_PAUSE_SECONDS)
    comm.Abort(code)


def _in_place(buffer: torch.Tensor, call: str) -> torch.Tensor:
    """``buffer`` itself, refused when it is not contiguous: MPI would write into a copy."""
    if not buffer.is_contiguous():
        raise ValueError(f"{call}: the buffer must be contiguous (MPI writes into it in place)")
    return buffer


class GroupCommunicator(MPICommunicator):
    """A communicator split from another (``MPICommunicator.split``): its collectives are the
    same calls, waited on through the same ``_timed``, and every byte and second it counts is
    also counted in its parent's counters, which the epoch's metrics read."""

    def __init__(self, comm: "MPI.Comm", parent: MPICommunicator, name: str):
        self.parent = parent
        self._own_seconds = 0.0
        super().__init__(comm, parent.watchdog, name)  # the world's watchdog sees its waits

    @property
    def seconds(self) -> float:  # type: ignore[override]
        return self._own_seconds

    @seconds.setter
    def seconds(self, value: float) -> None:
        self.parent.seconds += value - self._own_seconds  # a reset adds nothing (see below)
        self._own_seconds = value

    def reset_counters(self) -> None:
        self._own_seconds = 0.0  # the setter then forwards no negative time to the parent
        super().reset_counters()

    def _count(self, sent: int, received: int) -> None:
        super()._count(sent, received)
        self.parent._count(sent, received)


def world() -> MPICommunicator:
    return MPICommunicator(MPI.COMM_WORLD)
