"""An in-process stand-in for mpifgl.comm.Communicator: one thread per rank, collectives through
shared slots and a barrier. Same results as MPI (the server sums in rank order, unsigned sums
wrap), no mpirun, and a test can look at every buffer the server receives.

    world = ThreadWorld(4)
    results = world.run(lambda comm: body(comm))   # body(comm) on ranks 0..3, results by rank
"""
from __future__ import annotations

import pickle
import socket
import threading
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from mpifgl.communicator import TrafficCounters, allreduce_traffic, broadcast_traffic

BARRIER_SECONDS = 120.0


class ThreadWorld:
    def __init__(self, size: int):
        self.size = size
        # two sets of slots, used in turn by successive collectives: a rank writes the next
        # set only after every rank passed this one's barrier, i.e. after every rank finished
        # reading that set's previous use (two collectives ago), so one barrier per collective
        self.slots: list[list[Any]] = [[None] * size, [None] * size]
        self.barrier = threading.Barrier(size, timeout=BARRIER_SECONDS)
        # every array the server received from a client (gatherv, sums): what it "sees"
        self.server_received: list[tuple[str, int, np.ndarray]] = []
        self.max_to_all_calls = 0  # the agreements --secure needs beyond the sums themselves
        # the groups split from this world (ThreadComm.split): (split number, color) -> world
        self.groups: dict[tuple[int, int], ThreadWorld] = {}
        self.lock = threading.Lock()

    def run(self, body: Callable[["ThreadComm"], Any]) -> list[Any]:
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = body(ThreadComm(self, rank))
            except BaseException as exc:  # noqa: B036 - reported by run() below
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                         errors[0])
            raise first
        return results


class ThreadComm(TrafficCounters):
    """One rank's side; implements every member of mpifgl.communicator.Communicator."""

    def __init__(self, world: ThreadWorld, rank: int, parent: "ThreadComm | None" = None):
        self.world = world
        self.parent = parent  # a group's traffic is counted in its parent's too, as MPI's
        self._splits = 0  # splits made so far: every rank makes them in the same order
        self.rank = rank
        self.size = world.size
        self.client_id = rank - 1
        self.num_clients = world.size - 1
        self.is_server = rank == 0
        self.is_client = rank > 0
        self.is_single_process = False
        self.hosts = [socket.gethostname()] * world.size  # the threads are one node
        self.reset_counters()
        self._turn = 0  # which of the world's two slot sets the next collective uses

    @contextmanager
    def counting_exchange(self):
        yield

    def _share(self, value: Any) -> list[Any]:
        """Every rank's value, on every rank (the one primitive the collectives use)."""
        slots = self.world.slots[self._turn]
        self._turn ^= 1
        slots[self.rank] = value
        self.world.barrier.wait()
        return list(slots)

    def _seen(self, kind: str, values: list[Any]) -> None:
        if self.is_server:
            for rank, value in enumerate(values[1:], start=1):
                self.world.server_received.append((kind, rank, np.array(value, copy=True)))

    # -- buffer collectives (tensors in, tensors out; numpy inside, as MPI's views) ------------
    def gatherv(self, send: torch.Tensor, counts: np.ndarray | None) -> torch.Tensor | None:
        shared = self._share(_bits(send).copy())
        if not self.is_server:
            return None
        self._seen("gatherv", shared)
        flat = np.concatenate([s.ravel() for s in shared])
        assert flat.shape[0] == int(np.sum(counts)), "gatherv counts disagree with the buffers"
        return _from_bits(flat, send.dtype)

    def scatterv(self, send, counts, receive_count: int, dtype) -> torch.Tensor:
        mine = (_bits(send).ravel().copy(), np.asarray(counts)) if self.is_server else None
        shared = self._share(mine)
        flat, counts = shared[0]
        assert _from_bits(flat[:0], dtype).dtype == dtype, (flat.dtype, dtype)
        start = int(np.sum(counts[:self.rank]))
        assert int(counts[self.rank]) == receive_count
        return _from_bits(flat[start:start + receive_count].copy(), dtype)

    def reduce_sum(self, buffer: torch.Tensor) -> torch.Tensor | None:
        shared = self._share(buffer.numpy().copy())
        if not self.is_server:
            return None
        return torch.from_numpy(np.sum(shared, axis=0, dtype=shared[0].dtype))

    def gather_equal(self, send: torch.Tensor) -> torch.Tensor | None:
        shared = self._share(send.numpy().copy())
        return torch.from_numpy(np.stack(shared)) if self.is_server else None

    def broadcast_array(self, values: torch.Tensor | None) -> torch.Tensor:
        shared = self._share(None if values is None else values.numpy().copy())
        return torch.from_numpy(np.asarray(shared[0], dtype=np.int64).copy())

    def sum_to_all(self, values: torch.Tensor, segments=None) -> torch.Tensor:
        shared = self._share(values.numpy().copy())
        self._seen("sum", shared)
        total = shared[0].copy()
        for value in shared[1:]:
            total += value  # rank order, wrapping for unsigned words
        return torch.from_numpy(total)

    def sum_to_server(self, values: torch.Tensor) -> torch.Tensor | None:
        total = self.sum_to_all(values)
        return total if self.is_server else None

    def max_to_all(self, values: torch.Tensor) -> torch.Tensor:
        shared = self._share(values.numpy().astype(np.int64))
        if self.is_server:
            self.world.max_to_all_calls += 1
        return torch.from_numpy(np.max(np.stack(shared), axis=0))

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor | None:
        shared = self._share(row.numpy().astype(np.float64))
        return torch.from_numpy(np.stack(shared)) if self.is_server else None

    def allgather_rows(self, row: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.stack(self._share(row.numpy().astype(np.int64))))

    def gatherv_rows(self, rows: torch.Tensor) -> list[torch.Tensor] | None:
        shared = self._share(rows.numpy().copy())
        return [torch.from_numpy(s) for s in shared] if self.is_server else None

    # -- pickled (a real MPI pickles these: so do we, which also refuses unpicklable keys) ------
    def broadcast_object(self, value: Any) -> Any:
        shared = self._share(pickle.dumps(value) if self.is_server else None)
        return pickle.loads(shared[0])

    def gather_objects(self, value: Any) -> list[Any] | None:
        shared = self._share(pickle.dumps(value))
        return [pickle.loads(s) for s in shared] if self.is_server else None

    def scatter_objects(self, values: list[Any] | None) -> Any:
        shared = self._share(pickle.dumps(values) if self.is_server else None)
        return pickle.loads(shared[0])[self.rank]

    def agree_on_errors(self, error: str | None) -> list[tuple[int, int, str]]:
        return [(rank, rank - 1, message) for rank, message in enumerate(self._share(error))
                if message]

    def node_allgather(self, value: Any) -> list[Any]:
        return self._share(value)  # the threads are one node

    def wait_for_server(self, poll_seconds: float = 0.05) -> None:
        self._share(None)

    def abort(self, code: int = 1) -> None:
        self.world.barrier.abort()
        raise RuntimeError(f"rank {self.rank} aborted with status {code}")

    # -- groups of ranks: counted as mpifgl.comm counts them ---------------------------------
    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += int(sent)
        self.bytes_received += int(received)
        if self.parent is not None:
            self.parent._count(sent, received)

    def split(self, color: int, key: int) -> "ThreadComm | None":
        shared = self._share((color, key))
        number, self._splits = self._splits, self._splits + 1
        if color < 0:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(shared) if c == color)
        with self.world.lock:
            group = self.world.groups.setdefault((number, color), ThreadWorld(len(members)))
        return ThreadComm(group, members.index((key, self.rank)), parent=self)

    def broadcast_buffer(self, buffer: torch.Tensor, root: int) -> torch.Tensor:
        assert buffer.is_contiguous(), "broadcast_buffer needs a contiguous buffer"
        shared = self._share(buffer.numpy().copy() if self.rank == root else None)
        if self.rank != root:
            assert shared[root].shape == tuple(buffer.shape), (shared[root].shape, buffer.shape)
            buffer.copy_(torch.from_numpy(shared[root]))
        self._count(*broadcast_traffic(buffer.numel() * buffer.element_size(), self.size,
                                       self.rank == root))
        return buffer

    def allreduce_sum(self, buffer: torch.Tensor) -> torch.Tensor:
        assert buffer.is_contiguous(), "allreduce_sum needs a contiguous buffer"
        shared = self._share(buffer.numpy().copy())
        total = shared[0].copy()
        for value in shared[1:]:
            total += value  # rank order on every rank: the same bits everywhere
        buffer.copy_(torch.from_numpy(total))
        self._count(*allreduce_traffic(buffer.numel() * buffer.element_size(), self.size))
        return buffer

RAW_16_BIT = (torch.bfloat16, torch.float16)  # moved as their bits, as mpifgl.comm moves them


def _bits(tensor: torch.Tensor) -> np.ndarray:
    return tensor.view(torch.int16).numpy() if tensor.dtype in RAW_16_BIT else tensor.numpy()


def _from_bits(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if dtype in RAW_16_BIT else tensor
