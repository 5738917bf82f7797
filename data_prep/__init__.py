"""data_prep: load a graph dataset (or read your own), partition its nodes over M clients, write
one HDF5 shard per client plus a manifest (format: ``fgl_common.shard_format``), and verify shard
directories.

Command line: ``python -m data_prep --help`` and ``python -m data_prep verify SHARD_DIR``.
Python: ``data_prep.write_shards(data, num_clients, partition, out)`` for a graph built in Python,
``data_prep.api.prepare_shards(...)`` for the catalog's datasets. No MPI here; torch,
torch_geometric and ogb are imported only inside the loaders that need them.
"""
from typing import Any

__all__ = ["read_assignment", "write_shards"]


def __getattr__(name: str) -> Any:
    # loaded on first use, so that importing data_prep.catalog (plain data) stays cheap
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'data_prep' has no attribute {name!r}")
