"""A private SLURM cluster of several nodes on one machine: one ``slurmd`` per namespace host
(tests/helpers/netns.py), each its own node (``slurmd -N nodeK``, ``NodeAddr`` its address), under
one ``slurmctld`` in the head namespace, which every host reaches over the bridge. Client
commands (sbatch, scontrol, ...) run in the head namespace too; munged stays on the machine (its
socket is a file every namespace sees).

Everything else is ``tests.helpers.slurm.LocalSlurm``: state under one base directory, our own
munge key, daemons stopped by PID; the namespaces' own teardown kills whatever is left in them.

    with NamespaceHosts(2, work) as hosts, SlurmOnHosts(work / "slurm", hosts) as cluster:
        job = cluster.submit(["-N", "2", "-n", "9", "jobs/train.sbatch"], env={...})
        cluster.wait(job)
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

from tests.helpers.netns import HEAD_ADDRESS, NamespaceHosts
from tests.helpers.slurm import (SLURM_CONF_TEMPLATE, LocalSlurm, SlurmHarnessError, _alive,
                                 _free_port, _process_name, _which)

HEAD = "head"


class SlurmOnHosts(LocalSlurm):
    """slurmctld in ``hosts``' head namespace, a slurmd on each of its first ``nodes`` hosts."""

    def __init__(self, base: str | os.PathLike, hosts: NamespaceHosts, nodes: int = 2,
                 cpus: int = 16, mem_mb: int = 8000) -> None:
        super().__init__(base, cpus=cpus, mem_mb=mem_mb)
        self.namespace_hosts = hosts
        self.nodes = hosts.hosts[:nodes]
        self.host = HEAD
        self.daemon_pid_files = {  # stop order: the slurmds, slurmctld, munged
            **{f"slurmd-{node.name}": ("slurmd", self.base / f"slurmd-{node.name}.pid")
               for node in self.nodes},
            "slurmctld": ("slurmctld", self.base / "slurmctld.pid"),
            "munged": ("munged", self.base / "munge" / "munged.pid"),
        }
        self.pid_files = {key: path for key, (_, path) in self.daemon_pid_files.items()}

    def client_command(self, argv: Sequence[str]) -> list[str]:
        return self.namespace_hosts.in_head(argv)

    def _write_conf(self) -> None:
        ctld_port = self.ctld_port or _free_port()
        slurmd_port = _free_port()  # every slurmd listens in its own namespace on this port
        (self.base / "plugstack.conf").touch()
        common = SLURM_CONF_TEMPLATE.format(
            base=self.base, host=HEAD, cpus=self.cpus, mem_mb=self.mem_mb,
            ctld_port=ctld_port, slurmd_port=slurmd_port)
        per_node = {"SlurmctldHost": f"SlurmctldHost={HEAD}({HEAD_ADDRESS})",
                    "SlurmdSpoolDir": f"SlurmdSpoolDir={self.base}/spool/%n",
                    "SlurmdPidFile": f"SlurmdPidFile={self.base}/slurmd-%n.pid",
                    "SlurmdLogFile": f"SlurmdLogFile={self.base}/log/slurmd-%n.log"}
        lines = []
        for line in common.splitlines():
            key = line.split("=", 1)[0]
            if key in ("NodeName", "PartitionName"):
                continue
            lines.append(per_node.get(key, line))
        names = ",".join(node.name for node in self.nodes)
        lines += [f"NodeName={node.name} NodeAddr={node.address} CPUs={self.cpus} "
                  f"RealMemory={self.mem_mb} State=UNKNOWN" for node in self.nodes]
        lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE "
                     f"State=UP OverSubscribe=NO")
        # The slurmds' files differ in one line, as they may: their own TmpFS (where PMIx makes
        # a step's directory, the same name on every node), since these nodes share one /tmp.
        lines.append("DebugFlags=NO_CONF_HASH")
        text = "\n".join(lines) + "\n"
        self.conf.write_text(text + f"TmpFS={self.base}/tmp/{HEAD}\n")
        for node in self.nodes:
            (self.base / "tmp" / node.name).mkdir(parents=True, exist_ok=True)
            self.node_conf(node.name).write_text(text + f"TmpFS={self.base}/tmp/{node.name}\n")

    def node_conf(self, name: str) -> Path:
        return self.base / f"slurm-{name}.conf"

    def _start_daemons(self) -> None:
        starts = [self.namespace_hosts.in_head([_which("slurmctld"), "-c", "-f", str(self.conf)])]
        for node in self.nodes:
            (self.base / "spool" / node.name).mkdir(parents=True, exist_ok=True)
            starts.append(self.namespace_hosts.in_host(
                node.index, [_which("slurmd"), "-N", node.name, "-f",
                             str(self.node_conf(node.name))]))
        for argv in starts:  # each daemon forks away; its starter returns at once
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise SlurmHarnessError(f"{' '.join(argv)} exited {done.returncode}: "
                                        f"{done.stderr.strip()}\n{self.log_tail()}")

    def running_pids(self) -> dict[str, int]:
        found = {}
        for key, (name, pid_file) in self.daemon_pid_files.items():
            try:
                pid = int(Path(pid_file).read_text().strip())
            except (OSError, ValueError):
                continue
            if _alive(pid) and _process_name(pid) == name:
                found[key] = pid
        return found


def tasks_per_node(cluster: LocalSlurm, job_id: str) -> dict[str, int]:
    """How many CPUs (with ``--cpus-per-task=1``: tasks) the job has on each node, from
    ``scontrol show job -d`` (``Nodes=node1 CPU_IDs=0-7 ...`` lines)."""
    out = cluster._run(["scontrol", "show", "job", "-d", str(job_id)]).stdout
    layout = {}
    for line in out.splitlines():
        fields = dict(token.partition("=")[::2] for token in line.split() if "=" in token)
        if "Nodes" in fields and "CPU_IDs" in fields:
            count = 0
            for part in fields["CPU_IDs"].split(","):
                low, _, high = part.partition("-")
                count += int(high or low) - int(low) + 1
            layout[fields["Nodes"]] = count
    return layout
