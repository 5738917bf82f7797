"""mpifgl: MPI training program for subgraph-level federated graph learning.

Rank 0 is the server, ranks 1..m serve clients 0..m-1. Only ``mpifgl.comm`` imports mpi4py.
"""
__version__ = "0.1.0"
