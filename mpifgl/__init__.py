"""mpifgl: MPI training program for subgraph-level federated graph learning.

Rank 0 is the server, ranks 1..m serve clients 0..m-1. Only ``mpifgl.comm`` imports mpi4py.
"""
import os

# CPU tensors of 2 MB and more on transparent huge pages: on 4 KB pages every fresh activation
# costs a page fault per page (docs/hardware.md). PyTorch reads this at its first such
# allocation, so it is set before anything imports torch; the environment wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# glibc's allocator: every block of MMAP_THRESHOLD_BYTES or more is its own mapping, given back
# to the system when freed. By default glibc raises that threshold to each large block freed
# (up to 32 MB), after which a step's arrays below it come from the heap, whose freed middle it
# keeps: a client's peak RSS then holds free memory besides its arrays (docs/hardware.md).
# The environment wins (MALLOC_MMAP_THRESHOLD_); other C libraries are left as they are.
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def _map_large_blocks() -> None:
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt: not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


_map_large_blocks()

__version__ = "0.1.0"
