"""Local bias of a run: how far its output logits are from those of a centrally trained model.

    python -m mpifgl.bias RUN_DIR --reference CENTRALIZED_RUN_DIR \
        [--noise-reference OTHER_CENTRALIZED_RUN_DIR] [--json OUT]

Local bias (paper section 4) = mean over nodes of the Euclidean distance between the run's
logits and the reference's logits, ``mean_u ||z_run(u) - z_ref(u)||_2``. It is reported over
all nodes and per client (client membership = the global ids in each ``client_i.h5`` of the
shard directory the RUN used). Two centralized runs that differ only in their seed are not
at distance 0 either: ``--noise-reference`` gives that noise floor (reference vs noise
reference), so a reader can tell bias from seed noise.

Both runs must have been trained with ``--save-logits`` (``logits.npy`` [n, C] in global node
order). Plain numpy: no torch, no MPI.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fgl_common.cli import add_dataclass_arguments, dataclass_from_namespace, option
from fgl_common.shard_format import ShardError, load_client_shard, read_manifest, shard_filename


class BiasError(ValueError):
    """A user-facing problem with the run directories given to the bias computation."""


# -- pure math ----------------------------------------------------------------------------------
def node_distances(logits: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Euclidean distance per node: ``||logits[u] - reference[u]||_2``, shape [n]."""
    if logits.shape != reference.shape:
        raise BiasError(f"logits have shape {logits.shape}, reference logits {reference.shape}; "
                        f"the two runs must be on the same graph and classes")
    diff = np.asarray(logits, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    return np.linalg.norm(diff, axis=1)


def mean_distance(logits: np.ndarray, reference: np.ndarray) -> float:
    """Local bias over all nodes: mean Euclidean distance between corresponding logit rows."""
    distances = node_distances(logits, reference)
    return float(distances.mean()) if distances.size else 0.0


def per_client_distance(logits: np.ndarray, reference: np.ndarray,
                        clients: list[np.ndarray]) -> list[float]:
    """Mean distance over each client's nodes; ``clients[i]`` = global ids of client i."""
    distances = node_distances(logits, reference)
    out = []
    for i, ids in enumerate(clients):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= distances.shape[0]):
            raise BiasError(f"client {i} holds global id {int(ids.max())}, but the logits "
                            f"have {distances.shape[0]} rows")
        out.append(float(distances[ids].mean()) if ids.size else float("nan"))
    return out


# -- reading run directories --------------------------------------------------------------------
@dataclass(frozen=True)
class RunLogits:
    run_dir: Path
    logits: np.ndarray  # [n, C], global node order
    dataset: str
    shards: str  # shard directory the run read
    seed: int | None
    algo: str


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BiasError(f"{path}: missing; is {path.parent} a run directory of "
                        f"`python -m mpifgl.train`?") from None
    except (OSError, ValueError) as exc:
        raise BiasError(f"{path}: unreadable ({exc})") from None


def _run_dataset(run_dir: Path, config: dict[str, Any]) -> str:
    final_path = run_dir / "final.json"
    if final_path.is_file():
        dataset = _read_json(final_path).get("dataset")
        if dataset:
            return str(dataset)
    shards = config.get("shards")
    if shards:
        try:
            return read_manifest(shards).dataset
        except ShardError:
            pass
    raise BiasError(f"{run_dir}: cannot tell which dataset the run used (no final.json with "
                    f"'dataset', and shard directory {shards!r} unreadable)")


def load_run_logits(run_dir: str | Path) -> RunLogits:
    """The logits and identity of a finished run; BiasError with the fix when they are absent."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BiasError(f"run directory {run_dir} does not exist")
    config = _read_json(run_dir / "config.json")
    path = run_dir / "logits.npy"
    if not path.is_file():
        raise BiasError(f"{path}: missing; re-run the training with --save-logits to write the "
                        f"logits the local-bias metric needs")
    try:
        logits = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BiasError(f"{path}: unreadable ({exc})") from None
    if logits.ndim != 2:
        raise BiasError(f"{path}: expected [num_nodes, num_classes], found shape {logits.shape}")
    return RunLogits(run_dir, logits, _run_dataset(run_dir, config), str(config.get("shards", "")),
                     config.get("seed"), str(config.get("algo", "?")))


def client_membership(shard_dir: str | Path) -> list[np.ndarray]:
    """Global node ids of every client (``client_i.h5`` /nodes/global_id), in client order."""
    try:
        manifest = read_manifest(shard_dir)
        return [load_client_shard(Path(shard_dir) / shard_filename(i), load_features=False)
                .global_id for i in range(manifest.num_clients)]
    except ShardError as exc:
        raise BiasError(f"reading client membership: {exc}") from None


def check_comparable(run: RunLogits, reference: RunLogits) -> None:
    if run.dataset != reference.dataset:
        raise BiasError(f"{run.run_dir} was trained on {run.dataset!r} but the reference "
                        f"{reference.run_dir} on {reference.dataset!r}; compare runs on the same "
                        f"dataset")
    if run.logits.shape != reference.logits.shape:
        raise BiasError(f"{run.run_dir}/logits.npy has shape {run.logits.shape} but "
                        f"{reference.run_dir}/logits.npy has {reference.logits.shape}; the runs "
                        f"must cover the same nodes and classes")


# -- the report ---------------------------------------------------------------------------------
@dataclass
class BiasReport:
    run: str
    reference: str
    dataset: str
    num_nodes: int
    local_bias: float  # mean distance over all nodes
    per_client: list[float] = field(default_factory=list)  # client i = rank i + 1
    client_sizes: list[int] = field(default_factory=list)
    noise_reference: str | None = None
    noise_floor: float | None = None  # reference vs noise reference (seed noise)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """What the figure is, the figure, and how to judge it: against the seed-noise floor
        when --noise-reference was given, else how to get that floor."""
        lines = [f"local bias of {self.run} ({self.dataset}, {self.num_nodes} nodes) against "
                 f"{self.reference}: {self.local_bias:.4f}",
                 "  = the mean over nodes of the Euclidean distance between this run's output "
                 "logits and the centralized reference's (0: the same outputs; lower: less "
                 "local bias)"]
        if self.noise_floor is not None:
            ratio = (self.local_bias / self.noise_floor if self.noise_floor > 0
                     else float("inf"))
            verdict = ("within the seed noise" if ratio <= 1.0 else
                       f"{ratio:.2f} times the seed noise")
            lines.append(f"noise floor: {self.noise_floor:.4f} = the same distance between "
                         f"{self.reference} and {self.noise_reference} (two centralized runs "
                         f"that differ in their seed); bias / noise = {ratio:.2f}: the run's "
                         f"outputs differ from centralized training by {verdict}")
        else:
            lines.append("  no noise floor: pass --noise-reference with a second centralized "
                         "run of another --seed to compare this figure with the seed noise")
        if self.per_client:
            lines.append("per client (mean over its nodes):")
        for i, (value, size) in enumerate(zip(self.per_client, self.client_sizes)):
            lines.append(f"  client {i:3d} ({size:6d} nodes): {value:.4f}")
        return "\n".join(lines)


def local_bias(run_dir: str | Path, reference_dir: str | Path,
               noise_reference_dir: str | Path | None = None,
               shard_dir: str | Path | None = None) -> BiasReport:
    """Local bias of ``run_dir`` against ``reference_dir`` (see the module docstring).

    ``shard_dir`` overrides the shard directory recorded in the run's config.json (the source
    of client membership)."""
    run = load_run_logits(run_dir)
    reference = load_run_logits(reference_dir)
    check_comparable(run, reference)
    shards = shard_dir or run.shards
    clients = client_membership(shards) if shards else []
    report = BiasReport(str(run.run_dir), str(reference.run_dir), run.dataset,
                        int(run.logits.shape[0]), mean_distance(run.logits, reference.logits),
                        per_client_distance(run.logits, reference.logits, clients),
                        [int(ids.shape[0]) for ids in clients])
    if noise_reference_dir is not None:
        noise = load_run_logits(noise_reference_dir)
        check_comparable(noise, reference)
        report.noise_reference = str(noise.run_dir)
        report.noise_floor = mean_distance(noise.logits, reference.logits)
    return report


@dataclass(frozen=True)
class BiasArgs:
    """The command line of ``python -m mpifgl.bias``."""

    run_dir: str = option(MISSING, "run directory of the model to measure", positional=True)
    reference: str = option(MISSING, "centralized run directory", required=True)
    noise_reference: str | None = option(None, "a second centralized run with another seed: its "
                                               "distance to --reference is the seed-noise floor")
    shards: str | None = option(None, "shard directory for client membership (default: the "
                                      "run's own)")
    json: str | None = option(None, "also write the report as JSON here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpifgl.bias",
        description="Local bias = mean Euclidean distance between a run's logits and those of a "
                    "centralized reference run (both trained with --save-logits).")
    add_dataclass_arguments(parser, BiasArgs)
    args = dataclass_from_namespace(BiasArgs, parser.parse_args(argv))
    try:
        report = local_bias(args.run_dir, args.reference, args.noise_reference, args.shards)
    except BiasError as exc:
        print(f"mpifgl.bias: error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
