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


@pytest.mark.timeout(500)
def test_sbatch_over_two_nodes_trains_with_ranks_on_both(hosts, toy_graph, tmp_path):
    """With the allocation's srun (8 clients, 9 ranks) and with Open MPI's mpirun (3 clients,
    4 ranks: whose mapping policy, from the launch environment, must follow SLURM's placement
    rather than fill the first node)."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with SlurmOnHosts(tmp_path / "slurm", hosts) as cluster:
        for launcher, clients in (("srun", 8), ("mpirun", 3)):
            shards = write_shards(toy_graph, random_parts(toy_graph.num_nodes, clients, seed=0),
                                  tmp_path / f"shards-{clients}")
            run, log = tmp_path / f"run-{launcher}", tmp_path / f"job-{launcher}.out"
            job = cluster.submit(["-N", "2", "-n", str(clients + 1), "-o", str(log),
                                  str(REPO / "jobs" / "train.sbatch")],
                                 env={"SHARD_DIR": str(shards), "RUN_DIR": str(run),
                                      "EPOCHS": "2", "MPI_LAUNCHER": launcher,
                                      "EXTRA_ARGS": "--hidden 8 --log-every 100"}, cwd=REPO)
            state = cluster.wait(job, timeout=200)
            allocated = tasks_per_node(cluster, job)
            assert state == "COMPLETED", \
                log.read_text()[-3000:] if log.exists() else cluster.log_tail()
            assert f"via {launcher}" in log.read_text(), log.read_text()[-2000:]
            hosts_of_ranks = json.loads((run / "config.json").read_text())["hosts"]
            assert sorted(allocated) == ["node1", "node2"]
            assert sum(allocated.values()) == clients + 1
            assert Counter(hosts_of_ranks) == allocated, launcher
