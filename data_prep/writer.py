"""Write a partitioned graph as a shard directory, atomically.

Shards and manifest go to a hidden temporary directory next to the target; it is verified and only
then renamed into place. With ``force`` the old directory is moved aside first and removed only
after the rename succeeded. Any failure (error, KeyboardInterrupt, full disk) removes the temporary
directory and leaves an existing target untouched; a full file system is reported for the file of
the target that did not fit, with the bytes it needed and the bytes free once the partial output is
gone. The temporary directories carry their owner (``.<name>.partial-<host>-<pid>-<random>``): those
of a killed process (kill -9) are removed by the next run writing next to them, except the previous
shards a process killed between the two renames of ``force`` had moved aside (``.<name>.old-...``
with no ``target``): the next run puts them back and says so. The directory gets the mode a plain
``mkdir`` gives (0777 less the umask), or, replacing one, the mode of the one it replaces."""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from fgl_common import shard_format
from fgl_common.diskspace import DiskFullError, disk_full_error, write_bytes
from fgl_common.ownership import owner_is_dead, owner_tag, remove_dead_owners, tagged_owner
from fgl_common.protected import SHARD_DIRECTORY, check_output_directory

from .graph import GraphData
from .partition import Partition
from .progress import bar, warn
from .verify import verify_shard_dir

MANIFEST_NAME = shard_format.MANIFEST_NAME


def check_output_target(target: Path, force: bool) -> None:
    """Fail early (before any loading) when the output cannot or must not be written: it is
    another program's directory or inside one (``fgl_common.protected``), or exists."""
    target = Path(target)
    check_output_directory(target, "--out", SHARD_DIRECTORY)
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise ValueError(f"output {target} exists and is not a directory")
        if not force:
            raise FileExistsError(f"output {target} already exists; pass --force to replace it "
                                  f"(the old one is removed only after the new one is complete)")
        if any(target.iterdir()) and not (target / MANIFEST_NAME).is_file():
            raise ValueError(f"refusing to replace {target}: it is not empty and holds no "
                             f"{MANIFEST_NAME}, so it is not a shard directory")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"output directory {parent} cannot be created ({exc.strerror or exc})") \
            from None
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"output directory {parent} is not writable")


def client_blocks(adjacency: sp.csr_matrix, nodes: np.ndarray, assignment: np.ndarray,
                  local_index: np.ndarray, sizes: np.ndarray) -> dict[int, sp.csr_matrix]:
    """Blocks A_ij (rows: ``nodes`` of client i; columns: local indices in client j) for every
    client j with at least one edge."""
    num_clients = sizes.shape[0]
    rows = adjacency[nodes]  # CSR [n_i, n]; columns stay ascending within each row
    n_i = nodes.shape[0]
    row_of_entry = np.repeat(np.arange(n_i, dtype=np.int64), np.diff(rows.indptr))
    owner = assignment[rows.indices]
    order = np.argsort(owner, kind="stable")  # group by client, keeping row-major order
    owner_sorted = owner[order]
    bounds = np.searchsorted(owner_sorted, np.arange(num_clients + 1))
    blocks = {}
    for j in range(num_clients):
        lo, hi = bounds[j], bounds[j + 1]
        if lo == hi:
            continue
        picked = order[lo:hi]
        block_rows = row_of_entry[picked]
        indices = local_index[rows.indices[picked]].astype(np.int64)
        indptr = np.zeros(n_i + 1, dtype=np.int64)
        np.cumsum(np.bincount(block_rows, minlength=n_i), out=indptr[1:])
        blocks[j] = sp.csr_matrix((np.ones(indices.shape[0], dtype=np.float32), indices, indptr),
                                  shape=(n_i, int(sizes[j])))
    return blocks


def write_shards(graph: GraphData, partition: Partition, directory: Path,
                 manifest_extra: dict[str, Any], seed: int, show_progress: bool = False
                 ) -> dict[str, Any]:
    """Write client_{i}.h5 for every client and manifest.json into ``directory``; return the
    manifest."""
    m = partition.num_clients
    assignment = partition.assignment
    sizes = np.bincount(assignment, minlength=m)
    local_index = np.empty(graph.num_nodes, dtype=np.int64)
    for client in range(m):  # local order = ascending global id
        local_index[assignment == client] = np.arange(sizes[client])
    degree = np.diff(graph.adjacency.indptr).astype(np.int64)
    clients = []
    with bar(f"writing {m} shards", m, show_progress) as count:
        for client in range(m):
            nodes = np.flatnonzero(assignment == client)
            blocks = client_blocks(graph.adjacency, nodes, assignment, local_index, sizes)
            y = graph.y[nodes]
            shard = shard_format.ClientShard(
                client_id=client, global_id=nodes.astype(np.int64), x=graph.x[nodes], y=y,
                train_mask=graph.train_mask[nodes], val_mask=graph.val_mask[nodes],
                test_mask=graph.test_mask[nodes], degree=degree[nodes], blocks=blocks,
                attrs={"format_version": shard_format.FORMAT_VERSION, "dataset": graph.name,
                       "num_clients": m, "client_id": client,
                       "partition": manifest_extra["partition"], "seed": seed})
            path = directory / shard_format.shard_filename(client)
            shard_format.write_client_shard(path, shard)
            inner = blocks.get(client)
            clients.append({
                "client_id": client,
                "file": shard_format.shard_filename(client),
                "num_nodes": int(nodes.shape[0]),
                "num_inner_edges": int(inner.nnz // 2) if inner is not None else 0,
                "num_cross_edges": int(sum(b.nnz for j, b in blocks.items() if j != client)),
                "class_counts": np.bincount(y, minlength=graph.num_classes).tolist(),
                "num_train": int(shard.train_mask.sum()),
                "num_val": int(shard.val_mask.sum()),
                "num_test": int(shard.test_mask.sum()),
                "sha256": shard_format.file_sha256(path),
            })
            del shard, blocks
            count.update()
    cross_edges = sum(c["num_cross_edges"] for c in clients) // 2
    manifest = {
        "format_version": shard_format.FORMAT_VERSION,
        "dataset": graph.name,
        "split_rule": graph.split_rule,
        **manifest_extra,
        "seed": seed,
        "num_clients": m,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_features": graph.num_features,
        "num_classes": graph.num_classes,
        "num_train": int(graph.train_mask.sum()),
        "num_val": int(graph.val_mask.sum()),
        "num_test": int(graph.test_mask.sum()),
        "num_cross_edges": int(cross_edges),
        "cross_edge_fraction": cross_edges / graph.num_edges if graph.num_edges else 0.0,
        "source": graph.source,
        "clients": clients,
    }
    write_bytes(directory / MANIFEST_NAME, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def restore_interrupted_replacement(target: Path) -> Path | None:
    """Put back the shards a data_prep killed between the two renames of ``force`` moved aside:
    no ``target``, and ``.<name>.old-<owner>`` of a dead owner next to it (the newest, where a
    second kill left more; the others are named and kept). Returns what was restored."""
    target = Path(target)
    if target.exists() or target.is_symlink():
        return None  # the rename into place happened: an .old- folder is the replaced copy
    prefix = f".{target.name}.old-"
    try:
        entries = [p for p in target.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return None
    dead = [p for p in entries if p.is_dir() and (owner := tagged_owner(p.name[len(prefix):]))
            is not None and owner_is_dead(*owner)]
    if not dead:
        return None
    dead.sort(key=lambda p: p.stat().st_mtime)
    os.rename(dead[-1], target)
    kept = (f"; older copies kept: {', '.join(str(p) for p in dead[:-1])}" if dead[:-1] else "")
    warn(f"restored {target} from {dead[-1].name}: a data_prep killed while replacing it "
         f"(--force) had moved the previous shards aside{kept}")
    return target


def installed_mode(target: Path) -> int:
    """The mode of the shard directory: the one it replaces keeps its own (a group-shared 0755
    or setgid directory stays so), a new one gets 0777 less the umask, as mkdir gives."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o777 & ~umask


def write_shard_directory(graph: GraphData, partition: Partition, target: Path, force: bool,
                          manifest_extra: dict[str, Any], seed: int,
                          show_progress: bool = False) -> dict[str, Any]:
    """Write, verify and install the shard directory ``target``; see the module docstring."""
    target = Path(target)
    restore_interrupted_replacement(target)
    check_output_target(target, force)
    for kind in ("partial", "old"):  # left by a killed run
        remove_dead_owners(target.parent, f".{target.name}.{kind}-")
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{owner_tag()}-",
                                    dir=target.parent))
    try:
        manifest = write_shards(graph, partition, scratch, manifest_extra, seed, show_progress)
        report = verify_shard_dir(scratch, show_progress=show_progress)
        if not report.ok:
            raise RuntimeError("internal error: the shards just written fail verification:\n  "
                               + "\n  ".join(report.problems))
        os.chmod(scratch, installed_mode(target))  # mkdtemp made it private while incomplete
        _install(scratch, target, force)
    except DiskFullError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        # named as the file of the target, measured without the partial output
        error = disk_full_error(target / Path(exc.filename).name, exc.errno, exc.needed)
        error.strerror += "; partial output removed" + (
            f", the existing {target} untouched" if target.exists() else "")
        raise error from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return manifest


def _install(scratch: Path, target: Path, force: bool) -> None:
    if not target.exists():
        os.rename(scratch, target)
        return
    check_output_target(target, force)  # re-check: something may have appeared meanwhile
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{owner_tag()}-", dir=target.parent))
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(scratch, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
