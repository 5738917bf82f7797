"""data_prep: load a graph dataset, partition its nodes over M clients, write one HDF5 shard per
client plus a manifest (format: ``fgl_common.shard_format``), and verify shard directories.

Command line: ``python -m data_prep --help`` and ``python -m data_prep verify SHARD_DIR``.
Python: ``data_prep.api.prepare_shards(...)``. No MPI here; torch_geometric / ogb are imported only
inside the loaders that need them.
"""
