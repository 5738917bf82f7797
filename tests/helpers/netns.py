"""Namespace hosts: cluster nodes stood in for by Linux network namespaces on one machine, for
the multinode tier (tests/multinode) and benchmarks/bench_network.py.

What ``NamespaceHosts(2)`` makes (all with ``ip``, as root), every name starting with
``PREFIX`` and this process's pid, so that a sweep can find what a killed run left behind:

* a head namespace (the login node): a bridge ``br0`` holding 198.18.0.254/24; ``mpirun``,
  ``slurmctld`` and ``sbatch`` run here;
* host k (k = 1, 2, ...): a namespace whose ``eth0`` (a veth, its peer ``pk`` a port of the
  bridge) holds 198.18.0.k/24; every process entered there gets the hostname ``nodek`` in a
  UTS namespace of its own, so MPI's shared-memory split (``COMM_TYPE_SHARED``) sees one node
  per host.

Addresses come only from 198.18.0.0/15 (the benchmarking range of RFC 2544) and no namespace has
a default route: a packet can reach another namespace host and nothing else. The file system is
the machine's (one mount namespace, bar what ``hidden`` hides on a host), so a shard path is
seen by every host, as a cluster's shared file system is.

Open MPI starts its daemon (``prted``) on a host through ``agent`` (``--prtemca plm_ssh_agent``,
called as ssh is: ``agent HOST COMMAND``), which runs the command inside that host; the daemon
inherits mpirun's environment (PATH, the venv, PYTHONPATH), as the ranks it starts do.

``stop`` kills every process left in the namespaces and deletes them (their links and the
hostname and mount namespaces go with them); ``sweep_leftovers`` does the same for the
namespaces of processes that no longer exist. Use::

    with NamespaceHosts(2, work_dir) as hosts:
        done = hosts.mpirun(5, [script, ...], {1: 1, 2: 4}, env)  # server on node1, 4 on node2
        hosts.shape(100e6)                                      # tbf: 100 Mb/s each way
        hosts.link_counters()                                   # bytes and packets per host
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from fgl_common.launch import mpirun_path
from tests.helpers import REPO
from tests.helpers.slurm import _alive as process_alive

PREFIX = "mpifgl-nh"
SUBNET = "198.18.0.0/24"  # inside 198.18.0.0/15; Open MPI's TCP traffic is kept to it
HEAD_ADDRESS = "198.18.0.254"
MAX_HOSTS = 8
HOST_LINK = "eth0"
# Where `ip netns add` names a namespace; a process enters one with nsenter, which (unlike `ip
# netns exec`) keeps the machine's /sys and its cgroup mounts, which slurmd needs.
NETNS_DIR = "/run/netns"
STOP_SECONDS = 5.0


class NamespaceError(RuntimeError):
    """Namespace hosts cannot be made here (the reason says why: not root, no ``ip``, EPERM)."""


@dataclass(frozen=True)
class Host:
    """One namespace host: its namespace, hostname and address."""

    index: int  # 1, 2, ...
    netns: str
    name: str
    address: str


def _ip(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)} exited {done.returncode}: "
                             f"{done.stderr.strip()}")
    return done


def missing_requirements() -> str | None:
    """Why namespace hosts cannot be made here, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "namespace hosts need root (ip netns add, veth pairs, UTS namespaces)"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH (apt-get install iproute2 util-linux)"
    return None


def netns_names() -> list[str]:
    """Every network namespace ``ip netns list`` shows."""
    done = _ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _owner_alive(netns: str) -> bool:
    """Whether the process that made ``netns`` (its pid is in the name) still runs."""
    try:
        return process_alive(int(netns[len(PREFIX):].split("-")[1]))
    except (IndexError, ValueError):
        return False


def _kill_namespace_processes(netns: str, timeout: float = STOP_SECONDS) -> None:
    """SIGTERM every process in ``netns``, SIGKILL what is left after ``timeout`` s."""
    def pids() -> list[int]:
        done = _ip("netns", "pids", netns, check=False)
        return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids():
            return


def remove_namespace(netns: str) -> None:
    """Kill what runs in ``netns``, then delete it (its veth ends go with it)."""
    _kill_namespace_processes(netns)
    _ip("netns", "del", netns, check=False)


def sweep_leftovers(owner: int | None = None) -> list[str]:
    """Remove the namespaces of this helper whose maker is gone (with ``owner``: those that
    process made); returns their names."""
    swept = []
    for netns in netns_names():
        if not netns.startswith(f"{PREFIX}-"):
            continue
        if (netns.startswith(f"{PREFIX}-{owner}-") if owner is not None
                else not _owner_alive(netns)):
            remove_namespace(netns)
            swept.append(netns)
    return swept


def enter_command(netns: str, hostname: str, command: Sequence[str],
                  hide: Sequence[str] = ()) -> list[str]:
    """``command`` run inside a namespace host: its network namespace, its hostname, and a
    mount namespace of its own in which each of ``hide`` is covered by an empty tmpfs."""
    mounts = "".join(f"mount -t tmpfs -o size=64k,mode=0755 mpifgl-hidden {shlex.quote(p)} && "
                     for p in hide)
    return ["nsenter", f"--net={NETNS_DIR}/{netns}", "unshare", "--uts", "--mount",
            "--propagation", "private", "--", "sh", "-c", f'hostname "$0" && {mounts}exec "$@"',
            hostname, *command]


AGENT_TEMPLATE = """#!/bin/sh
# Open MPI's launch agent for the namespace hosts of {work}, called as ssh is:
#   agent HOST COMMAND...   (COMMAND is one shell command line, as for a remote login shell)
host=$1
shift
case "$host" in
{cases}
  *) echo "namespace agent: unknown host '$host'" >&2; exit 255 ;;
esac
exec nsenter --net={netns_dir}/"$ns" unshare --uts --mount --propagation private -- \\
  sh -c "hostname $name && $hide$*"
"""


class NamespaceHosts:
    """``count`` namespace hosts behind one bridge, and a head namespace; a context manager.

    ``hidden``: host index -> paths covered by an empty tmpfs in every process started there
    (a path that one host does not see, as a node-local disk)."""

    def __init__(self, count: int, work_dir: str | os.PathLike,
                 hidden: Mapping[int, Sequence[str]] | None = None) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"namespace hosts: {count} hosts, expected 1..{MAX_HOSTS}")
        self.work_dir = Path(work_dir).resolve()
        self.tag = f"{PREFIX}-{os.getpid()}-{time.monotonic_ns() % 10 ** 9}"
        self.head = f"{self.tag}-head"
        self.hosts = [Host(k, f"{self.tag}-h{k}", f"node{k}", f"198.18.0.{k}")
                      for k in range(1, count + 1)]
        self.hidden = {k: [str(p) for p in paths] for k, paths in (hidden or {}).items()}
        self.agent = self.work_dir / "namespace-agent"
        self.shaped_rate: float | None = None

    # ---- make and remove ---------------------------------------------------------------------
    def start(self) -> "NamespaceHosts":
        reason = missing_requirements()
        if reason:
            raise NamespaceError(reason)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            _ip("netns", "add", self.head)
            _ip("-n", self.head, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.head, "addr", "add", f"{HEAD_ADDRESS}/24", "dev", "br0")
            for link in ("lo", "br0"):
                _ip("-n", self.head, "link", "set", link, "up")
            for host in self.hosts:
                port = f"p{host.index}"
                _ip("netns", "add", host.netns)
                _ip("-n", host.netns, "link", "add", HOST_LINK, "type", "veth", "peer", "name",
                    port, "netns", self.head)
                _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", HOST_LINK)
                for link in ("lo", HOST_LINK):
                    _ip("-n", host.netns, "link", "set", link, "up")
                _ip("-n", self.head, "link", "set", port, "master", "br0")
                _ip("-n", self.head, "link", "set", port, "up")
            self._check_no_way_out()
            self._write_agent()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_no_way_out(self) -> None:
        """Every route of every namespace stays inside the subnet: no default route."""
        for netns in self.namespaces():
            routes = _ip("-n", netns, "-j", "route", "show", "table", "all").stdout
            for route in json.loads(routes or "[]"):
                destination = route.get("dst", "")
                if destination == "default" or route.get("gateway"):
                    raise NamespaceError(f"namespace {netns} has a route out: {route}")

    def _write_agent(self) -> None:
        cases = []
        for host in self.hosts:
            hide = "".join(f"mount -t tmpfs -o size=64k,mode=0755 mpifgl-hidden "
                           f"{shlex.quote(p)} && " for p in self.hidden.get(host.index, []))
            cases.append(f"  {host.address}|{host.name}) ns={host.netns} name={host.name} "
                         f"hide={shlex.quote(hide)} ;;")
        self.agent.write_text(AGENT_TEMPLATE.format(work=self.work_dir, cases="\n".join(cases),
                                                    netns_dir=NETNS_DIR))
        self.agent.chmod(0o755)

    def namespaces(self) -> list[str]:
        return [self.head] + [host.netns for host in self.hosts]

    def stop(self) -> None:
        """Kill every process in the namespaces and delete them (hosts first, then the head)."""
        for netns in reversed(self.namespaces()):
            if netns in netns_names():
                remove_namespace(netns)

    def __enter__(self) -> "NamespaceHosts":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---- running things there ----------------------------------------------------------------
    def host(self, index: int) -> Host:
        return self.hosts[index - 1]

    def in_head(self, command: Sequence[str]) -> list[str]:
        return enter_command(self.head, "head", command)

    def in_host(self, index: int, command: Sequence[str]) -> list[str]:
        host = self.host(index)
        return enter_command(host.netns, host.name, command, self.hidden.get(index, ()))

    def mpirun_options(self, slots: Mapping[int, int], map_by: str = "slot") -> list[str]:
        """mpirun's options for ranks on these hosts: ``slots`` maps a host's index to its slots,
        in the order ranks fill them (the first host listed gets rank 0), ``--map-by map_by``."""
        listed = ",".join(f"{self.host(k).address}:{n}" for k, n in slots.items())
        return ["--prtemca", "plm_ssh_agent", str(self.agent),
                "--prtemca", "plm_ssh_no_tree_spawn", "1",  # each daemon from the head
                "--host", listed, "--map-by", f"{map_by}:OVERSUBSCRIBE", "--bind-to", "none",
                "--mca", "btl_tcp_if_include", SUBNET,
                "--prtemca", "oob_tcp_if_include", SUBNET]

    def mpirun_command(self, ranks: int, argv: Sequence[str], slots: Mapping[int, int],
                       map_by: str = "slot", python: str = sys.executable) -> list[str]:
        """``mpirun -n ranks OPTIONS python ARGV``, run in the head namespace."""
        return self.in_head([mpirun_path(), "-n", str(ranks),
                             *self.mpirun_options(slots, map_by), python, *argv])

    def mpirun(self, ranks: int, argv: Sequence[str], slots: Mapping[int, int],
               env: Mapping[str, str], map_by: str = "slot", timeout: float = 120,
               cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
        """Run ``mpirun_command`` to the end with a hard timeout (a hang fails, never blocks)."""
        return subprocess.run(self.mpirun_command(ranks, argv, slots, map_by), env=dict(env),
                              cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout)

    def launcher(self, slots: Mapping[int, int], env: Mapping[str, str], map_by: str = "slot"):
        """``launch(ranks, argv, timeout=...)`` on these hosts, in the form of
        ``tests.helpers.mpi.run_mpi``, for the checks written against that."""
        def launch(ranks: int, argv: Sequence[str], timeout: float = 120, cwd=None):
            return self.mpirun(ranks, argv, slots, env, map_by, timeout, cwd)
        return launch

    # ---- the links ---------------------------------------------------------------------------
    def shape(self, rate_bits: float | None) -> None:
        """Every host's link limited to ``rate_bits`` per second each way (tbf on both ends of
        its veth), or unlimited with None."""
        for host in self.hosts:
            for netns, link in ((host.netns, HOST_LINK), (self.head, f"p{host.index}")):
                _ip("-n", netns, "link", "set", link, "up")
                subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", link,
                                "root"], capture_output=True, timeout=20)
                if rate_bits is not None:
                    command = ["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", link,
                               "root", *tbf_arguments(rate_bits)]
                    done = subprocess.run(command, capture_output=True, text=True, timeout=20)
                    if done.returncode != 0:
                        raise NamespaceError(f"{' '.join(command)}: {done.stderr.strip()}")
        self.shaped_rate = rate_bits

    def link_counters(self) -> dict[str, dict[str, int]]:
        """Per host: the bytes and packets its link has sent and received so far."""
        found = {}
        for host in self.hosts:
            stats = json.loads(_ip("-n", host.netns, "-s", "-j", "link", "show",
                                   HOST_LINK).stdout)[0]["stats64"]
            found[host.name] = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                                "tx_packets": stats["tx"]["packets"],
                                "rx_packets": stats["rx"]["packets"]}
        return found


def tbf_arguments(rate_bits: float) -> list[str]:
    """``tbf`` for a link of ``rate_bits``/s: a bucket of 1 ms at that rate, at least 64 KiB (a
    veth hands tbf whole offloaded segments; a smaller bucket drops them), and a queue of
    50 ms, at least 1 MiB, so that TCP finds the rate without losing segments."""
    rate_bytes = rate_bits / 8
    burst = max(64 * 1024, int(rate_bytes / 1000))
    limit = max(2 ** 20, int(rate_bytes * 0.05))
    return ["tbf", "rate", f"{int(rate_bits)}bit", "burst", str(burst), "limit", str(limit)]
