"""``python -m data_prep verify SHARD_DIR``: check a shard directory and report EVERY problem.

Checks: manifest readable and consistent; no missing or extra shard files; sha256 of every shard;
every shard readable HDF5 with the documented shapes; counts and dimensions equal to the manifest
(nodes, features, classes, inner/cross edges, class histogram, split counts); every feature finite
(no NaN or infinity); degrees equal to row sums; no self loops or duplicate entries; A_ij == A_ji^T
for every pair of clients; global ids cover 0..n-1 exactly once and are ascending inside each
client."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from fgl_common import shard_format

from .progress import bar, stage

MAX_LISTED_IDS = 5  # how many offending node ids a message quotes


@dataclass
class VerifyReport:
    shard_dir: Path
    problems: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    clients_read: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        self.problems.append(problem)


def _quote_ids(ids: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:MAX_LISTED_IDS])
    return shown + (", ..." if ids.shape[0] > MAX_LISTED_IDS else "")


def _read_manifest(shard_dir: Path, report: VerifyReport) -> dict[str, Any] | None:
    path = shard_dir / shard_format.MANIFEST_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        report.add(f"{path}: manifest missing")
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add(f"{path}: not readable JSON ({exc})")
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("clients"), list):
        report.add(f"{path}: expected a JSON object with a 'clients' list")
        return None
    try:
        shard_format.read_manifest(shard_dir)
    except shard_format.ShardError as exc:
        report.add(str(exc))  # keep going with the raw manifest: later checks name the details
    return raw


def _check_structure(shard: shard_format.ClientShard, client: int, path: Path,
                     report: VerifyReport) -> None:
    """What verify checks beyond ``shard_format.shard_problems`` (which training checks too)."""
    non_finite = shard_format.non_finite_rows(shard.x)
    if non_finite is not None:
        report.add(f"{path}: /nodes/x holds non-finite values: "
                   f"{shard_format.describe_non_finite(non_finite, 'row', shard.global_id)}")
    for j, block in shard.blocks.items():
        if not block.has_canonical_format:
            report.add(f"{path}: /adj/{j} has unsorted or duplicate column indices in a row")
    inner = shard.blocks.get(client)
    if inner is not None and inner.shape[0] == inner.shape[1] and inner.diagonal().any():
        report.add(f"{path}: /adj/{client} holds self loops")


def _check_transposes(blocks: dict[int, dict[int, sp.csr_matrix]], shard_dir: Path,
                      report: VerifyReport) -> None:
    clients = sorted(blocks)
    for a_pos, i in enumerate(clients):
        for j in clients[a_pos:]:
            a_ij, a_ji = blocks[i].get(j), blocks[j].get(i)
            if a_ij is None and a_ji is None:
                continue
            if a_ij is None or a_ji is None:
                have, lack = (i, j) if a_ji is None else (j, i)
                nnz = (a_ij if a_ij is not None else a_ji).nnz
                report.add(f"{shard_dir}: client {have} holds /adj/{lack} ({nnz} edges) but "
                           f"client {lack} has no /adj/{have}; A_{i}{j} != A_{j}{i}^T")
                continue
            if a_ij.shape != (a_ji.shape[1], a_ji.shape[0]):
                report.add(f"{shard_dir}: A_{i}{j} has shape {a_ij.shape}, A_{j}{i} has shape "
                           f"{a_ji.shape}; not transposes")
                continue
            left = a_ij.astype(bool).astype(np.int8).tocsr()
            right = a_ji.T.astype(bool).astype(np.int8).tocsr()
            left.sort_indices()
            right.sort_indices()
            if not (np.array_equal(left.indptr, right.indptr)
                    and np.array_equal(left.indices, right.indices)):
                differ = int((left != right).nnz)
                report.add(f"{shard_dir}: A_{i}{j} (in {shard_format.shard_filename(i)}) is not "
                           f"the transpose of A_{j}{i} (in {shard_format.shard_filename(j)}): "
                           f"{differ} entries differ")


def verify_shard_dir(shard_dir: str | Path, show_progress: bool = False) -> VerifyReport:
    """Check ``shard_dir`` completely; never raises for a bad directory (see ``problems``)."""
    shard_dir = Path(shard_dir)
    report = VerifyReport(shard_dir)
    if not shard_dir.is_dir():
        report.add(f"{shard_dir}: shard directory does not exist")
        return report
    raw = _read_manifest(shard_dir, report)
    if raw is None:
        return report
    report.manifest = raw
    entries = raw["clients"]
    num_clients = raw.get("num_clients", len(entries))
    if not isinstance(num_clients, int) or num_clients < 0:
        report.add(f"{shard_dir}: manifest num_clients {num_clients!r} is not a count")
        num_clients = len(entries)
    expected = {shard_format.shard_filename(i) for i in range(num_clients)}
    present = {p.name for p in shard_dir.iterdir()} - {shard_format.MANIFEST_NAME}
    for name in sorted(expected - present):
        report.add(f"{shard_dir / name}: shard file missing")
    for name in sorted(present - expected):
        report.add(f"{shard_dir / name}: unexpected file (manifest lists {num_clients} clients)")

    manifest = shard_format.Manifest(raw)
    sizes = [int(e.get("num_nodes", -1)) if isinstance(e, dict) else -1 for e in entries]
    global_ids: dict[int, np.ndarray] = {}
    blocks: dict[int, dict[int, sp.csr_matrix]] = {}
    total_nnz = 0
    cross_nnz = 0
    with bar(f"verifying {num_clients} shards", num_clients, show_progress) as count:
        for client in range(num_clients):
            count.update(0)
            path = shard_dir / shard_format.shard_filename(client)
            entry = entries[client] if client < len(entries) and isinstance(entries[client], dict) \
                else {}
            if not path.is_file():
                count.update()
                continue
            if "sha256" in entry and shard_format.file_sha256(path) != entry["sha256"]:
                report.add(f"{path}: sha256 checksum mismatch (file changed since it was written)")
            try:
                shard = shard_format.load_client_shard(path)
            except shard_format.ShardError as exc:
                report.add(str(exc))
                count.update()
                continue
            except Exception as exc:  # h5py may fail in many ways on a damaged file
                report.add(f"{path}: unreadable shard ({type(exc).__name__}: {exc})")
                count.update()
                continue
            report.clients_read += 1
            try:  # the checks training makes at set-up, every problem on a line of its own
                if len(sizes) == num_clients:
                    for problem in shard_format.shard_problems(shard, manifest, client):
                        report.add(f"{path}: {problem}")
            except Exception as exc:
                report.add(f"{path}: could not compare with the manifest "
                           f"({type(exc).__name__}: {exc})")
            _check_structure(shard, client, path, report)
            global_ids[client] = shard.global_id
            blocks[client] = shard.blocks
            total_nnz += sum(b.nnz for b in shard.blocks.values())
            cross_nnz += sum(b.nnz for j, b in shard.blocks.items() if j != client)
            del shard
            count.update()

    all_read = len(global_ids) == num_clients
    n = raw.get("num_nodes")
    if global_ids and isinstance(n, int) and n >= 0:
        ids = np.concatenate(list(global_ids.values()))
        outside = ids[(ids < 0) | (ids >= n)]
        if outside.size:
            report.add(f"{shard_dir}: {outside.size} global ids outside 0..{n - 1} "
                       f"({_quote_ids(outside)})")
        counts = np.bincount(ids[(ids >= 0) & (ids < n)], minlength=n)
        duplicated = np.flatnonzero(counts > 1)
        if duplicated.size:
            report.add(f"{shard_dir}: {duplicated.size} node ids appear in more than one place "
                       f"across clients ({_quote_ids(duplicated)})")
        missing = np.flatnonzero(counts == 0)
        if missing.size and all_read:
            report.add(f"{shard_dir}: {missing.size} node ids of 0..{n - 1} belong to no client "
                       f"({_quote_ids(missing)})")
    with stage("verifying A_ij == A_ji^T for every pair of clients", show_progress):
        _check_transposes(blocks, shard_dir, report)
    if all_read:
        num_edges = raw.get("num_edges")
        if num_edges is not None and total_nnz != 2 * num_edges:
            report.add(f"{shard_dir}: the shards hold {total_nnz} adjacency entries, manifest "
                       f"num_edges {num_edges} needs {2 * num_edges}")
        fraction = raw.get("cross_edge_fraction")
        if num_edges and fraction is not None \
                and abs(fraction - cross_nnz / 2 / num_edges) > 1e-9:
            report.add(f"{shard_dir}: cross_edge_fraction {fraction} in the manifest, the shards "
                       f"give {cross_nnz / 2 / num_edges}")
    return report
