"""SLURM across two nodes: a slurmd in each of two namespace hosts, each its own node, under
one slurmctld (tests/helpers/slurm_hosts.py); ``sbatch -N 2 -n 9 jobs/train.sbatch`` trains with
ranks on both nodes, placed as SLURM allocated them. Skipped, with the reason, where SLURM is
not installed (as the slurm tier is)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers import REPO
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.slurm import missing_requirements
from tests.helpers.slurm_hosts import SlurmOnHosts, tasks_per_node


@pytest.mark.timeout(400)
def test_sbatch_over_two_nodes_trains_with_ranks_on_both(hosts, toy_graph, tmp_path):
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    shards = write_shards(toy_graph, random_parts(toy_graph.num_nodes, 8, seed=0),
                          tmp_path / "shards")
    run, log = tmp_path / "run", tmp_path / "job.out"
    with SlurmOnHosts(tmp_path / "slurm", hosts) as cluster:
        job = cluster.submit(["-N", "2", "-n", "9", "-o", str(log),
                              str(REPO / "jobs" / "train.sbatch")],
                             env={"SHARD_DIR": str(shards), "RUN_DIR": str(run), "EPOCHS": "2",
                                  "EXTRA_ARGS": "--hidden 8 --log-every 100"}, cwd=REPO)
        state = cluster.wait(job, timeout=300)
        allocated = tasks_per_node(cluster, job)
    assert state == "COMPLETED", log.read_text()[-3000:] if log.exists() else cluster.log_tail()
    assert "via srun" in log.read_text()  # the allocation's own launcher: srun --mpi=pmix
    hosts_of_ranks = json.loads((run / "config.json").read_text())["hosts"]
    assert sorted(allocated) == ["node1", "node2"] and sum(allocated.values()) == 9
    assert Counter(hosts_of_ranks) == allocated
