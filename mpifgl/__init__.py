"""mpifgl: MPI training program for subgraph-level federated graph learning.

Rank 0 is the server, ranks 1..m serve clients 0..m-1. Only ``mpifgl.comm`` imports mpi4py.
"""
import os

# CPU tensors of 2 MB and more on transparent huge pages: on 4 KB pages every fresh activation
# costs a page fault per page (docs/hardware.md). PyTorch reads this at its first such
# allocation, so it is set before anything imports torch; the environment wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
