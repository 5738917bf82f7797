"""The communicator interface every part of the program talks to, and its one-process world.

Who a rank is, in one vocabulary (used everywhere in mpifgl):

* ``rank``, ``size``: the rank's place in the world;
* ``is_server``: the root of every collective (rank 0): it gets the sums, writes the run
  directory and logs;
* ``is_client``: the rank holds graph nodes and trains on them; ``client_id`` is which client
  (-1 on a server that is not also a client);
* ``num_clients``: how many clients the world has;
* ``is_single_process``: a world of one process that is server and client 0 at once (the
  centralized algorithms and in-process tests).

In an MPI world of m + 1 ranks, rank 0 is the server and rank r >= 1 serves client r - 1
(``client_of_rank``). ``mpifgl.comm.MPICommunicator`` implements the interface over MPI (the only
mpi4py import); ``LocalComm`` below implements it for one process.
"""
from __future__ import annotations

import socket
import sys
from contextlib import contextmanager
from typing import Any, ContextManager, Iterator, Protocol, runtime_checkable

import numpy as np
import torch

SERVER_RANK = 0


def client_of_rank(rank: int) -> int:
    """Client id served by an MPI rank (-1 for the server)."""
    return rank - 1


def rank_of_client(client_id: int) -> int:
    return client_id + 1


@runtime_checkable
class Communicator(Protocol):
    """What the program calls on a communicator. Every call below is collective: every rank of
    the world makes it, in the same order. Buffers are torch tensors in host memory (a device
    tensor is copied to the host first); counts are int64 numpy arrays. "At the server" means
    the call returns the result on the server and None elsewhere."""

    rank: int
    size: int
    client_id: int
    is_server: bool
    is_client: bool
    num_clients: int
    is_single_process: bool
    hosts: list[str]  # every rank's host name, in rank order (the node the launcher put it on)
    # traffic since the last reset_counters: logical payload, what this rank contributed to a
    # collective is "sent", what it got back is "received"
    seconds: float
    bytes_sent: int
    bytes_received: int
    exchange_bytes_sent: int  # the cross-client exchange's share (counting_exchange)
    exchange_bytes_received: int

    def reset_counters(self) -> None: ...

    def extra_counters(self) -> dict[str, int]:
        """Counts of this communicator's own events since reset_counters, for the epoch's
        metrics (a masked communicator: its redone operations); empty for a plain one."""
        ...

    def counting_exchange(self) -> ContextManager[None]:
        """Inside this block, traffic is also counted as the cross-client exchange's."""
        ...

    # -- buffer collectives (the cross-client exchange) --------------------------------------
    def gatherv(self, send: torch.Tensor, counts: np.ndarray | None) -> torch.Tensor | None:
        """Every rank's buffer end to end at the server, flat; ``counts`` [size] at the server."""
        ...

    def scatterv(self, send: torch.Tensor | None, counts: np.ndarray | None, receive_count: int,
                 dtype: torch.dtype) -> torch.Tensor:
        """The server's flat ``send`` cut into ``counts``; each rank gets its ``receive_count``."""
        ...

    def reduce_sum(self, buffer: torch.Tensor) -> torch.Tensor | None:
        """The sum of every rank's ``buffer`` at the server (in the server's buffer)."""
        ...

    def gather_equal(self, send: torch.Tensor) -> torch.Tensor | None:
        """Every rank's buffer of one shape -> [size, *shape] at the server."""
        ...

    def broadcast_array(self, values: torch.Tensor | None) -> torch.Tensor:
        """The server's int64 1-D tensor on every rank."""
        ...

    # -- small sums and gathers --------------------------------------------------------------
    def sum_to_all(self, values: torch.Tensor, segments: list[int] | None = None) -> torch.Tensor:
        """The sum over ranks on every rank, bit-identical everywhere. ``segments``: lengths of
        pieces of ``values`` that may be scaled apart (a masked sum's fixed point; a plain sum
        ignores them)."""
        ...

    def sum_to_server(self, values: torch.Tensor) -> torch.Tensor | None: ...

    def max_to_all(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of an int64 vector over ranks, on every rank."""
        ...

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor | None:
        """One float64 row per rank -> [size, k] at the server."""
        ...

    def allgather_rows(self, row: torch.Tensor) -> torch.Tensor:
        """One int64 row per rank, one length everywhere -> [size, k] on every rank."""
        ...

    def gatherv_rows(self, rows: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's 2-D tensor (one width) -> one tensor per rank at the server."""
        ...

    # -- set-up, checkpoints, errors (pickled, rare) -----------------------------------------
    def broadcast_object(self, value: Any) -> Any: ...

    def gather_objects(self, value: Any) -> list[Any] | None: ...

    def scatter_objects(self, values: list[Any] | None) -> Any: ...

    def agree_on_errors(self, error: str | None) -> list[tuple[int, int, str]]:
        """Every rank's set-up error as (rank, client id, message), on every rank."""
        ...

    def node_allgather(self, value: Any) -> list[Any]:
        """Every value of the ranks on this rank's node (shared memory), in their order there,
        on each of them (set-up: dividing the node's cores and GPUs)."""
        ...

    def wait_for_server(self, poll_seconds: float = 0.05) -> None:
        """A barrier that leaves the CPU to the server while it works."""
        ...

    def abort(self, code: int = 1) -> None:
        """End the whole job from this rank."""
        ...

    # -- groups of ranks (CAGNET's row and column groups) -------------------------------------
    def split(self, color: int, key: int) -> "Communicator | None":
        """A communicator of the ranks that pass this ``color`` (>= 0), ordered by ``key``;
        None on a rank that passes a negative color. Collective over this communicator. The
        group's traffic and seconds are also counted in this communicator's counters (so the
        epoch's metrics hold them); its rank 0 is the root of its server-rooted calls."""
        ...

    def broadcast_buffer(self, buffer: torch.Tensor, root: int) -> torch.Tensor:
        """Rank ``root``'s contiguous host buffer into every rank's ``buffer`` (one shape and
        dtype everywhere), in place; returns ``buffer``."""
        ...

    def allreduce_sum(self, buffer: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks of a contiguous host buffer, in place on every rank;
        returns ``buffer``."""
        ...


def broadcast_traffic(nbytes: int, size: int, is_root: bool) -> tuple[int, int]:
    """(sent, received) of one rank in a broadcast of ``nbytes`` over ``size`` ranks, as
    logical payload: the root sends a copy to each other rank, each other rank receives one."""
    return (nbytes * (size - 1), 0) if is_root else (0, nbytes)


def allreduce_traffic(nbytes: int, size: int) -> tuple[int, int]:
    """(sent, received) of one rank in an allreduce of ``nbytes``, as logical payload: its
    buffer in, the sum back (in a group of two this is also what a ring moves); a group of one
    moves nothing."""
    return (nbytes, nbytes) if size > 1 else (0, 0)


class TrafficCounters:
    """The counters every communicator keeps (``Communicator``'s accounting attributes): seconds
    in collectives, payload bytes, and the cross-client exchange's share of them."""

    def reset_counters(self) -> None:
        self.seconds = 0.0
        self.bytes_sent = self.bytes_received = 0
        self.exchange_bytes_sent = self.exchange_bytes_received = 0  # terms and their row ids

    def extra_counters(self) -> dict[str, int]:
        return {}


class LocalComm(TrafficCounters):
    """The world of one process holding the whole graph: the server and client 0 at once.

    Every collective of ``Communicator`` with one rank: sums and gathers of one contribution,
    nothing to wait for, no traffic. Results are fresh arrays, as MPI's are."""

    rank, size = SERVER_RANK, 1
    client_id, num_clients = 0, 1
    is_server = is_client = is_single_process = True

    def __init__(self) -> None:
        self.hosts = [socket.gethostname()]
        self.reset_counters()

    @contextmanager
    def counting_exchange(self) -> Iterator[None]:
        yield  # one rank moves no bytes

    # -- buffer collectives ------------------------------------------------------------------
    def gatherv(self, send: torch.Tensor, counts: np.ndarray | None) -> torch.Tensor:
        flat = send.reshape(-1).clone()
        _check_counts(counts, flat.shape[0], "gatherv")
        return flat

    def scatterv(self, send: torch.Tensor | None, counts: np.ndarray | None, receive_count: int,
                 dtype: torch.dtype) -> torch.Tensor:
        flat = send.reshape(-1).to(dtype)
        _check_counts(counts, flat.shape[0], "scatterv")
        if int(receive_count) != flat.shape[0]:
            raise ValueError(f"scatterv: receive count {receive_count}, the one rank is sent "
                             f"{flat.shape[0]} elements")
        return flat.clone()

    def reduce_sum(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer.contiguous()

    def gather_equal(self, send: torch.Tensor) -> torch.Tensor:
        return send.clone()[None]

    def broadcast_array(self, values: torch.Tensor | None) -> torch.Tensor:
        return values.to(torch.int64, copy=True)

    # -- small sums and gathers --------------------------------------------------------------
    def sum_to_all(self, values: torch.Tensor, segments: list[int] | None = None) -> torch.Tensor:
        return values.clone()

    def sum_to_server(self, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    def max_to_all(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(torch.int64, copy=True)

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor:
        return row.to(torch.float64, copy=True)[None, :]

    def allgather_rows(self, row: torch.Tensor) -> torch.Tensor:
        return row.to(torch.int64, copy=True)[None, :]

    def gatherv_rows(self, rows: torch.Tensor) -> list[torch.Tensor]:
        return [rows.clone()]

    # -- set-up, checkpoints, errors ---------------------------------------------------------
    def broadcast_object(self, value: Any) -> Any:
        return value

    def gather_objects(self, value: Any) -> list[Any]:
        return [value]

    def scatter_objects(self, values: list[Any] | None) -> Any:
        if values is None or len(values) != 1:
            raise ValueError(f"scatter_objects in a world of one rank needs one value, got "
                             f"{None if values is None else len(values)}")
        return values[0]

    def agree_on_errors(self, error: str | None) -> list[tuple[int, int, str]]:
        return [(self.rank, self.client_id, error)] if error else []

    def node_allgather(self, value: Any) -> list[Any]:
        return [value]

    def wait_for_server(self, poll_seconds: float = 0.05) -> None:
        pass  # the one process is the server

    def abort(self, code: int = 1) -> None:
        """The whole job is this process: exit with ``code``."""
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(code)

    # -- groups: of one rank, nothing moves ---------------------------------------------------
    def split(self, color: int, key: int) -> "LocalComm | None":
        return LocalComm() if color >= 0 else None

    def broadcast_buffer(self, buffer: torch.Tensor, root: int) -> torch.Tensor:
        if root != 0:
            raise ValueError(f"broadcast_buffer from rank {root} in a world of one rank")
        return buffer

    def allreduce_sum(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer


def _check_counts(counts: np.ndarray | None, elements: int, call: str) -> None:
    """The server's counts of a one-rank world: one entry, the whole buffer."""
    if counts is not None and (len(counts) != 1 or int(counts[0]) != elements):
        raise ValueError(f"{call}: counts {list(np.asarray(counts))} for a world of one rank "
                         f"holding {elements} elements, expected [{elements}]")
