"""Local bias of a run: how far its output logits are from those of a centrally trained model.

    python -m mpifgl.bias RUN_DIR --reference CENTRALIZED_RUN_DIR \
        [--noise-reference OTHER_CENTRALIZED_RUN_DIR] [--json OUT]

Local bias (paper section 4) = mean over nodes of the Euclidean distance between the run's
logits and the reference's logits, ``mean_u ||z_run(u) - z_ref(u)||_2``. It is reported over
all nodes and per client (client membership = the global ids in each ``client_i.h5`` of the
shard directory the RUN used). Two centralized runs that differ only in their seed are not
at distance 0 either: ``--noise-reference`` gives that noise floor (reference vs noise
reference), so a reader can tell bias from seed noise. Beside it, the disagreement: the share
of nodes whose predicted class differs from the reference's, which the logits' scale does not
move (a run whose logits grew larger than the reference's reads as biased by the distance).

Both runs must have been trained with ``--save-logits`` (``logits.npy`` [n, C] in global node
order). What is read is checked against the runs' records first: a reference is a centralized
run (``--algo centralized``) of the same graph as the run, which means the same dataset, nodes,
edges, features, classes and split (and a synthetic graph's generator settings):
``fgl_common.shard_identity.graph_fingerprint``, recorded by every run. The partition may
differ (the merged shards of the run's partition, another partition, another number of
clients): logits are in global node order, which every partition of a graph shares. The
shards that give client membership must be the run's own partition (its recorded
``shards_fingerprint``). ``--json`` never replaces a file of a run (``fgl_common.protected``).
Plain numpy: no torch, no MPI.
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
from fgl_common.diskspace import write_bytes
from fgl_common.protected import ProtectedPathError, check_output_file
from fgl_common.shard_format import ShardError, load_client_shard, read_manifest, shard_filename
from fgl_common.shard_identity import describe as describe_shards
from fgl_common.shard_identity import describe_graph, fingerprint, graph_fingerprint


class BiasError(ValueError):
    """A user-facing problem with the run directories given to the bias computation."""


# -- pure math ----------------------------------------------------------------------------------
def _check_shapes(logits: np.ndarray, reference: np.ndarray) -> None:
    if logits.shape != reference.shape:
        raise BiasError(f"logits have shape {logits.shape}, reference logits {reference.shape}; "
                        f"the two runs must be on the same graph and classes")


def node_distances(logits: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Euclidean distance per node: ``||logits[u] - reference[u]||_2``, shape [n]."""
    _check_shapes(logits, reference)
    diff = np.asarray(logits, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    return np.linalg.norm(diff, axis=1)


def mean_distance(logits: np.ndarray, reference: np.ndarray) -> float:
    """Local bias over all nodes: mean Euclidean distance between corresponding logit rows."""
    distances = node_distances(logits, reference)
    return float(distances.mean()) if distances.size else 0.0


def disagreement(logits: np.ndarray, reference: np.ndarray) -> float:
    """Share of nodes (0-1) whose predicted class (argmax) differs from the reference's. Blind to
    the logits' scale, which the distance reads as bias: a model whose logits are the
    reference's times 3 has a large distance and no disagreement."""
    _check_shapes(logits, reference)
    if not logits.shape[0]:
        return 0.0
    return float(np.mean(logits.argmax(axis=1) != reference.argmax(axis=1)))


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
REFERENCE_ALGO = "centralized"  # the paper's reference: the same model trained on the whole graph


@dataclass(frozen=True)
class RunLogits:
    run_dir: Path
    logits: np.ndarray  # [n, C], global node order
    dataset: str
    shards: str  # shard directory the run read
    seed: int | None
    algo: str
    shards_fingerprint: str | None = None  # as recorded by the run (None: an older run)
    graph_fingerprint: str | None = None  # recorded, else from its shards' manifest
    graph_description: str | None = None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BiasError(f"{path}: missing; is {path.parent} a run directory of "
                        f"`python -m mpifgl.train`?") from None
    except (OSError, ValueError) as exc:
        raise BiasError(f"{path}: unreadable ({exc})") from None


def _run_record(run_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """What the run recorded about itself: final.json over config.json (a run that has
    logits.npy finished, so both are there; older runs lack some keys)."""
    final_path = run_dir / "final.json"
    final = _read_json(final_path) if final_path.is_file() else {}
    return {**config, **final}


def _run_dataset(run_dir: Path, record: dict[str, Any]) -> str:
    if record.get("dataset"):
        return str(record["dataset"])
    shards = record.get("shards")
    if shards:
        try:
            return read_manifest(shards).dataset
        except ShardError:
            pass
    raise BiasError(f"{run_dir}: cannot tell which dataset the run used (no final.json with "
                    f"'dataset', and shard directory {shards!r} unreadable)")


def _graph_of(record: dict[str, Any]) -> tuple[str | None, str | None]:
    """(graph fingerprint, description) of a run: recorded, else from the manifest of its
    shards when they are still the ones it was trained on (or it recorded none)."""
    if record.get("graph_fingerprint"):
        return str(record["graph_fingerprint"]), record.get("graph_description")
    try:
        manifest = read_manifest(record.get("shards") or "").raw
    except (ShardError, OSError):
        return None, None
    recorded = record.get("shards_fingerprint")
    if recorded and recorded != fingerprint(manifest):
        return None, None  # re-made since: they do not tell what the run read
    return graph_fingerprint(manifest), describe_graph(manifest)


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
    record = _run_record(run_dir, config)
    graph, description = _graph_of(record)
    return RunLogits(run_dir, logits, _run_dataset(run_dir, record),
                     str(config.get("shards", "")), config.get("seed"),
                     str(config.get("algo", "?")), record.get("shards_fingerprint"), graph,
                     description)


def client_membership(shard_dir: str | Path) -> list[np.ndarray]:
    """Global node ids of every client (``client_i.h5`` /nodes/global_id), in client order."""
    try:
        manifest = read_manifest(shard_dir)
        return [load_client_shard(Path(shard_dir) / shard_filename(i), load_features=False)
                .global_id for i in range(manifest.num_clients)]
    except ShardError as exc:
        raise BiasError(f"reading client membership: {exc}") from None


def check_reference(reference: RunLogits, flag: str) -> None:
    """The reference of local bias is a centralized run (``--algo centralized``)."""
    if reference.algo != REFERENCE_ALGO:
        raise BiasError(f"{flag} {reference.run_dir}: its config.json says --algo "
                        f"{reference.algo}, expected --algo {REFERENCE_ALGO}: local bias is "
                        f"measured against the model trained centrally on the whole graph "
                        f"(`python -m mpifgl.train --algo centralized --save-logits ...`)")


def check_comparable(run: RunLogits, reference: RunLogits) -> None:
    """Both runs trained on the same graph (any partition of it: the logits are in global node
    order, the same for every partition) and give logits of the same shape."""
    if run.dataset != reference.dataset:
        raise BiasError(f"{run.run_dir} was trained on {run.dataset!r} but the reference "
                        f"{reference.run_dir} on {reference.dataset!r}; compare runs on the same "
                        f"dataset")
    if run.graph_fingerprint and reference.graph_fingerprint \
            and run.graph_fingerprint != reference.graph_fingerprint:
        raise BiasError(f"{run.run_dir} was trained on another graph ({run.graph_description}; "
                        f"graph {run.graph_fingerprint}) than the reference {reference.run_dir} "
                        f"({reference.graph_description}; graph {reference.graph_fingerprint}); "
                        f"local bias compares the logits of one graph: train the reference on "
                        f"the same dataset, split and generator settings (any partition of it)")
    if run.logits.shape != reference.logits.shape:
        raise BiasError(f"{run.run_dir}/logits.npy has shape {run.logits.shape} but "
                        f"{reference.run_dir}/logits.npy has {reference.logits.shape}; the runs "
                        f"must cover the same nodes and classes")


def check_membership_shards(run: RunLogits, shard_dir: str | Path, given: bool) -> list[str]:
    """The shards that say which client holds which node must be the run's own partition (its
    recorded fingerprint); BiasError naming both otherwise. Returns warnings (a run that
    recorded no fingerprint cannot be checked)."""
    flag = f"--shards {shard_dir}" if given else f"{run.run_dir}'s shards {shard_dir}"
    try:
        manifest = read_manifest(shard_dir).raw
    except ShardError as exc:
        raise BiasError(f"reading client membership: {exc}") from None
    if not run.shards_fingerprint:
        return [f"{run.run_dir} records no shard fingerprint (an older mpifgl.train): the client "
                f"membership in {shard_dir} is not checked against the partition it trained on"]
    found = fingerprint(manifest)
    if found != run.shards_fingerprint:
        fix = ("pass the shards it was trained on, or leave out --shards" if given else
               "they were re-made or replaced since; pass --shards with the shards it was "
               "trained on")
        raise BiasError(f"{flag}: these shards (fingerprint {found}: {describe_shards(manifest)}) "
                        f"are not the partition {run.run_dir} was trained on (fingerprint "
                        f"{run.shards_fingerprint}, recorded in its config.json), so the "
                        f"per-client figures would be wrong: {fix}")
    return []


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
    warnings: list[str] = field(default_factory=list)  # what could not be checked
    disagreement: float = 0.0  # share of nodes whose predicted class differs from the reference's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """What the figure is, the figure, and how to judge it: against the seed-noise floor
        when --noise-reference was given, else how to get that floor."""
        lines = [f"local bias of {self.run} ({self.dataset}, {self.num_nodes} nodes) against "
                 f"{self.reference}: {self.local_bias:.4f}",
                 "  = the mean over nodes of the Euclidean distance between this run's output "
                 "logits and the centralized reference's (0: the same outputs; lower: less "
                 "local bias)",
                 f"disagreement: {100 * self.disagreement:.2f}% of the nodes get another "
                 f"predicted class than from the reference (blind to the logits' scale, which "
                 f"the distance counts)"]
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
    of client membership). Checked first: the references are centralized runs of the run's
    graph (any partition of it), the membership shards are the run's own partition (its
    recorded fingerprint); BiasError naming both sides otherwise."""
    run = load_run_logits(run_dir)
    reference = load_run_logits(reference_dir)
    check_reference(reference, "--reference")
    check_comparable(run, reference)
    noise = None
    if noise_reference_dir is not None:
        noise = load_run_logits(noise_reference_dir)
        check_reference(noise, "--noise-reference")
        check_comparable(noise, reference)
    shards = shard_dir or run.shards
    warnings = check_membership_shards(run, shards, shard_dir is not None) if shards else []
    clients = client_membership(shards) if shards else []
    report = BiasReport(str(run.run_dir), str(reference.run_dir), run.dataset,
                        int(run.logits.shape[0]), mean_distance(run.logits, reference.logits),
                        per_client_distance(run.logits, reference.logits, clients),
                        [int(ids.shape[0]) for ids in clients], warnings=warnings,
                        disagreement=disagreement(run.logits, reference.logits))
    if noise is not None:
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
        if args.json:  # before the work: a report never replaces a file of a run
            check_output_file(args.json, "--json", is_own=is_bias_report)
        report = local_bias(args.run_dir, args.reference, args.noise_reference, args.shards)
        for warning in report.warnings:
            print(f"mpifgl.bias: warning: {warning}", file=sys.stderr)
        print(report.summary())
        if args.json:
            write_bytes(args.json, (json.dumps(report.to_dict(), indent=2) + "\n").encode())
    except (BiasError, ProtectedPathError, OSError) as exc:
        print(f"mpifgl.bias: error: {exc}", file=sys.stderr)
        return 1
    return 0


def is_bias_report(path: Path) -> bool:
    """Whether ``path`` holds a report this program wrote (``--json``): it may be rewritten."""
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(report, dict) and {"local_bias", "reference", "run"} <= set(report)


if __name__ == "__main__":
    sys.exit(main())
