"""Jobs whose ranks run on two or three hosts (namespace hosts, tests/helpers/netns.py): what
holds on one host holds across them. The distributed model equals centralized training (every
exchange mode, --secure, and each method of ``EXACTNESS``) with clients on both hosts and the
server on either; ranks land on the hosts as asked; threads and GPUs are divided per host;
config.json and the start line name every rank's host; a rank killed on the second host ends the
whole job; a shard directory a host does not see is one error naming that host.

Each mpirun over namespace hosts costs seconds of start-up, so each test makes few runs and
checks much of each."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers import REPO
from tests.helpers.exactness import check_against_references, run_probe, variant_output
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.mpi import MPI_SCRIPTS, rank_pids
from tests.helpers.runs import TRAIN, fedavg_one_client_equals_centralized, run_ok
from tests.mpi.test_reliability import ENDS_WITHIN, one_message

QUICK = ["--hidden", "8", "--sample-size", "30", "--log-every", "100"]
# Of the probe's backbone x dtype cases, two: the exactness tests on one host run them all.
CASES = [("gcn", "float64"), ("sage", "float32")]


@dataclass(frozen=True)
class AcrossHosts:
    """One exactness check across hosts: ``check(launch, graph, tmp_path)`` runs its jobs with
    ``launch`` (``tests.helpers.mpi.run_mpi``'s form, on the hosts of ``slots``) and asserts."""

    name: str
    slots: dict[int, int]  # host index -> ranks there, in rank order (the first: the server)
    check: Callable = field(repr=False)


def ours_probe(modes: str, ranks: int) -> Callable:
    """The exactness probe of ``ours`` for every exchange mode in ``modes`` (one job), each
    against the centralized and PyG references."""
    def check(launch, graph, tmp_path):
        shard_dir = write_shards(graph, random_parts(graph.num_nodes, ranks - 1, seed=5),
                                 tmp_path / "shards")
        out = tmp_path / "probe.npz"
        run_probe(shard_dir, out, ranks, 2, modes, cases=CASES, launch=launch)
        for mode in modes.split(","):
            check_against_references(graph, shard_dir, 2, variant_output(out, mode), CASES)
    return check


def fedavg_one_client(launch, graph, tmp_path):
    shard_dir = write_shards(graph, random_parts(graph.num_nodes, 1, seed=0), tmp_path / "shards")
    fedavg_one_client_equals_centralized(graph, shard_dir, tmp_path, launch)


# One more method is one more line: its check, run on the hosts of its slots.
EXACTNESS = [
    AcrossHosts("ours-compact-modes-server-on-node1", {1: 2, 2: 2},
                ours_probe("compact,compact-reduce,star", 4)),
    AcrossHosts("ours-reduce-and-secure-server-on-node2", {2: 2, 1: 2},
                ours_probe("reduce,compact+secure", 4)),
    AcrossHosts("fedavg-client-on-node2", {1: 1, 2: 1}, fedavg_one_client),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", EXACTNESS, ids=[case.name for case in EXACTNESS])
def test_distributed_equals_centralized_across_hosts(case, hosts, launch_env, toy_graph,
                                                     tmp_path):
    case.check(hosts.launcher(case.slots, launch_env), toy_graph, tmp_path)


@pytest.mark.timeout(200)
def test_each_host_places_its_own_ranks_and_the_run_names_the_hosts(hosts, launch_env,
                                                                     toy_shards, tmp_path):
    """4 ranks asked on node1 and 1 on node2: config.json counts them so, --threads auto gives
    node2's lone rank both cores and node1's four one each, the start line names the hosts."""
    run = tmp_path / "run"
    done = run_ok(hosts.mpirun(5, [*TRAIN, "--shards", str(toy_shards(4)), "--out", str(run),
                                   "--epochs", "2", "--threads", "auto", *QUICK],
                               {1: 4, 2: 1}, launch_env, timeout=150))
    config = json.loads((run / "config.json").read_text())
    assert config["hosts"] == ["node1"] * 4 + ["node2"]
    cores = len(os.sched_getaffinity(0))  # every namespace host has the machine's cores
    assert config["threads_per_rank"] == [max(1, cores // 4)] * 4 + [cores]
    start = [line for line in done.stdout.splitlines() if " over 4 clients " in line]
    assert len(start) == 1 and "on 2 hosts (node1: ranks 0-3, node2: rank 4)" in start[0], \
        done.stdout[-2000:]


@pytest.mark.timeout(120)
def test_ranks_go_where_asked_and_gpus_are_shared_out_per_host(hosts, launch_env, tmp_path):
    """``--map-by node`` over three hosts deals the ranks round robin, over the launch
    environment's default mapping policy; on nodes of 2 GPUs each host's clients take its
    GPUs in rank order from cuda:0 (a count over the whole job would give rank 2 cuda:1)."""
    out = tmp_path / "placement.json"
    run_ok(hosts.mpirun(5, [str(MPI_SCRIPTS / "probe_placement.py"), str(out), "cuda", "2"],
                        {1: 2, 2: 2, 3: 1}, launch_env, map_by="node", timeout=100))
    placed = json.loads(out.read_text())
    assert [p["host"] for p in placed] == ["node1", "node2", "node3", "node1", "node2"]
    # the server shares its node's first GPU; node2's clients (ranks 1, 4) take cuda:0, cuda:1
    assert [p["device"] for p in placed] == ["cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:1"]
    assert [p["threads"] for p in placed][1:] == [1, 1, 1, 1]  # GPU clients: one core each


@pytest.mark.timeout(120)
def test_a_sum_over_every_rank_crosses_each_hosts_link_once(hosts, launch_env, tmp_path):
    """The gradient sums' path (``sum_to_all``): node2's four ranks add up among themselves,
    so node2's link carries the 8 MB vector once each way, not once per rank."""
    vector = 8 * 2 ** 20
    before = hosts.link_counters()["node2"]
    run_ok(hosts.mpirun(6, [str(MPI_SCRIPTS / "probe_host_sums.py"), str(tmp_path / "out.json"),
                            str(vector // 8)], {1: 2, 2: 4}, launch_env, timeout=100))
    after = hosts.link_counters()["node2"]
    assert json.loads((tmp_path / "out.json").read_text()) == []
    for direction in ("tx_bytes", "rx_bytes"):  # start-up and headers add a few per cent
        assert vector <= after[direction] - before[direction] < 1.5 * vector, direction


def _start_training(hosts, launch_env, shards, run) -> subprocess.Popen:
    return subprocess.Popen(
        hosts.mpirun_command(5, [*TRAIN, "--shards", str(shards), "--out", str(run),
                                 "--epochs", "100000", *QUICK], {1: 3, 2: 2}),
        env=launch_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_rank_killed_on_the_second_host_ends_the_job(hosts, launch_env, toy_shards, tmp_path,
                                                       sig):
    """Rank 4 (client 3, on node2) killed mid-training: every rank ends. SIGTERM: one line of
    ours names the rank and its host; SIGKILL leaves the rank no word, so the launcher's
    report names the host."""
    run = tmp_path / "run"
    process = _start_training(hosts, launch_env, toy_shards(4), run)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        pids = rank_pids(str(run))
        assert sorted(pids) == [0, 1, 2, 3, 4], pids
        os.kill(pids[4], sig)
        started = time.monotonic()
        stdout, stderr = process.communicate(timeout=ENDS_WITHIN)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert time.monotonic() - started < ENDS_WITHIN
    if sig == signal.SIGTERM:
        one_message(done, "interrupted by SIGTERM on client 3 (rank 4 on node2)")
    else:
        assert done.returncode != 0 and "node2" in stderr, stderr[-3000:]


@pytest.mark.timeout(120)
def test_a_shard_directory_one_host_does_not_see_is_an_error_naming_it(hosts, launch_env,
                                                                      toy_graph):
    """Shards on a disk of node1 only (node2 sees an empty folder there): one line, naming the
    rank on node2 and the folder it could not read; no run directory is left."""
    shards = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 2, seed=0),
                          Path(hosts.hidden[2][0]) / "shards")
    run = Path(hosts.hidden[2][0]) / "run"
    done = hosts.mpirun(3, [*TRAIN, "--shards", str(shards), "--out", str(run), "--epochs", "1",
                            *QUICK], {1: 2, 2: 1}, launch_env, timeout=100)
    one_message(done, f"client 1 (rank 2 on node2): shard directory {shards} does not exist")
    assert done.returncode == 1 and not run.exists()
