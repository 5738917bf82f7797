"""Where a rank computes: its device (``--device``) and its CPU threads (``--threads``).

Threads, ``auto``: the cores this process may run on (its CPU affinity, capped by
``SLURM_CPUS_PER_TASK``) divided among the ranks of its node that may run on the same cores, at
least one. So auto never oversubscribes what the ranks share: 9 ranks on 2 cores get 1 thread
each, one process on 2 cores 2, and 4 ranks pinned to 4 cores each (``srun -c 4``) 4 each. A
client that computes on a GPU needs one core (its host work is the sampled operators and the
copies), so where the clients are on GPUs they take one thread each and the server, which sums
every client's messages on the host, the rest: 9 ranks on 16 cores and one GPU give the server
8 threads. A number N is taken as given. The threads go to torch (dense products, elementwise
work, and the sparse products of ``mpifgl.operators``).

Device, ``auto``: CUDA when torch sees a GPU, else the CPU. ``cuda``: the node's GPUs shared out
by the rank's place among the node's ranks (an MPI shared-memory split, not only environment
variables, so ``mpirun`` on a multi-GPU node and ``srun --gpus-per-task`` both spread the
clients; several ranks may share one GPU). ``cuda:N``: that GPU. The server rank takes a GPU too
when the clients do: it holds a copy of the model and takes the same optimizer step, which must
round as the clients' steps do; its sums over the clients' messages run on the host, where MPI
delivers them (a copy to the GPU and back would cost more than the sum).
"""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import torch

from mpifgl.communicator import Communicator
from mpifgl.config import check_device_spec, parse_threads


@dataclass(frozen=True)
class Placement:
    """One rank's device and thread count, and what the run records of them."""

    device: torch.device
    threads: int
    gpu_name: str = ""  # empty on the CPU
    host: str = ""  # the node it runs on (config.json and the start line name it)

    def describe(self) -> str:
        where = f"{self.device} ({self.gpu_name})" if self.gpu_name else "cpu"
        return f"{where}, {self.threads} thread{'s' if self.threads != 1 else ''}"


def usable_cores() -> set[int]:
    """The cores this process may run on: its affinity (all cores where the OS has none)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return set(range(os.cpu_count() or 1))


def auto_threads(mine: set[int], node_cores: list[set[int]], light: list[bool] | None = None,
                 i_am_light: bool = False) -> int:
    """``mine`` divided among the ranks of the node (``node_cores``: every local rank's cores,
    mine included) that may run on any of the same cores; ``light`` ranks (GPU clients) take
    one core each and the others share the rest. At least one, at most SLURM_CPUS_PER_TASK."""
    light = light or [False] * len(node_cores)
    sharing = [is_light for cores, is_light in zip(node_cores, light) if cores & mine]
    if i_am_light:
        threads = 1
    else:
        heavy = max(1, sum(1 for is_light in sharing if not is_light))
        threads = max(1, (len(mine) - sum(sharing)) // heavy)
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) >= 1:
        threads = min(threads, int(per_task))
    return threads


def resolve_device(spec: str, gpu_slot: int) -> torch.device:
    """The device of a rank whose place among the GPU-using ranks of its node is ``gpu_slot``.
    ValueError naming the flag when a GPU is asked for and there is none."""
    check_device_spec(spec)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "cpu" or (spec == "auto" and count == 0):
        return torch.device("cpu")
    if count == 0:
        built = torch.version.cuda or "none (a CPU build of torch)"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        raise ValueError(f"--device {spec}: torch sees no CUDA device (torch {torch.__version__}, "
                         f"CUDA {built}{hint}); use --device cpu or auto")
    if spec.startswith("cuda:"):
        index = int(spec[5:])
        if index >= count:
            raise ValueError(f"--device {spec}: this node has {count} CUDA device(s), "
                             f"cuda:0..cuda:{count - 1}")
        return torch.device("cuda", index)
    return torch.device("cuda", gpu_slot % count)


def place(device: str, threads: str, comm: Communicator) -> Placement:
    """This rank's placement (collective on the node: every local rank's cores and role are
    shared, so that the threads and the GPUs are divided among them)."""
    mine = usable_cores()
    # a client of an MPI world (not the one process of a centralized run) on a GPU
    light = (comm.is_client and not comm.is_server and device != "cpu"
             and torch.cuda.is_available())
    peers = comm.node_allgather((comm.rank, comm.is_client, light, sorted(mine)))
    requested = parse_threads(threads)
    count = requested or auto_threads(mine, [set(cores) for *_, cores in peers],
                                      [is_light for _, _, is_light, _ in peers], light)
    # clients spread over the node's GPUs in rank order; the server shares the first one
    clients = sorted(rank for rank, is_client, _, _ in peers if is_client)
    slot = clients.index(comm.rank) if comm.rank in clients else 0
    chosen = resolve_device(device, slot)
    name = torch.cuda.get_device_name(chosen) if chosen.type == "cuda" else ""
    return Placement(chosen, count, name, comm.hosts[comm.rank])


def apply(placement: Placement) -> None:
    """Make this process compute where ``placement`` says."""
    torch.set_num_threads(placement.threads)
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)


@functools.cache
def glibc() -> "ctypes.CDLL | None":
    """The process's C library where it is glibc, else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_free_heap() -> bool:
    """Give the pages of the allocator's free heap blocks back to the system (glibc's
    ``malloc_trim``): blocks freed in the middle of the heap stay resident otherwise, and count
    in the peak of whatever comes next. False where the C library is not glibc."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
    return libc is not None
