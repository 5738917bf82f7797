"""A private single-node SLURM cluster for testing the job scripts in ``jobs/``.

Starts ``munged``, ``slurmctld`` and ``slurmd`` as root with every file (munge key and socket,
slurm.conf, state, spool, logs, pid files) under one base directory, so it never touches
/etc/munge, /etc/slurm or /run. Stops them by PID. Written for Debian bookworm's SLURM 22.05
without systemd or cgroups (proctrack/linuxproc, task/none).

Two things that matter on small test machines:

* The node advertises ``cpus`` CPUs (default 16) whatever the hardware has, via
  ``SlurmdParameters=config_overrides``; with the real 2 CPUs an ``sbatch -n 9`` job pends forever.
* ``sbatch --wait`` notices the end of a job only at its next slow poll; ``wait`` here polls
  ``scontrol`` every 0.2 s instead.

Use from pytest::

    with LocalSlurm(tmp_path / "slurm") as cluster:
        job_id = cluster.submit(["jobs/train.sbatch"], env={...})
        state = cluster.wait(job_id, timeout=60)      # "COMPLETED", "FAILED", ...

or by hand (the daemons outlive the command; ``down`` stops them)::

    python tests/helpers/slurm.py up --base /tmp/mpifgl-slurm [--cpus 16]
    export SLURM_CONF=/tmp/mpifgl-slurm/slurm.conf
    python tests/helpers/slurm.py down --base /tmp/mpifgl-slurm

Requires root and ``apt-get install -y --no-install-recommends slurmctld slurmd slurm-client
munge libpmix-dev`` (libpmix-dev before slurmd starts, or ``srun --mpi=pmix`` steps time out).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENT_TOOLS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo", "munge", "unmunge")
# States in which a job may still change; anything else is final (COMPLETED, FAILED, ...).
ACTIVE_STATES = {"", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                 "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"}

SLURM_CONF_TEMPLATE = """\
# Written by tests/helpers/slurm.py: a private single-node cluster, all state under {base}.
ClusterName=mpifgltest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Trust CPUs= below rather than the detected hardware, so 9-task jobs run on a 2-CPU machine.
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=20
Waittime=0
PlugStackConfig={base}/plugstack.conf
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _set_child_subreaper(on: bool) -> bool:
    """Make this process adopt orphaned descendants (the daemons fork away from us), so that
    ``stop`` can reap them. Without it they are reparented to PID 1, which in some containers
    never reaps and leaves <defunct> entries behind. Returns False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_zombie_children(names: Sequence[str]) -> list[int]:
    """waitpid() our zombie children whose command is in ``names``; return their pids."""
    reaped = []
    me = os.getpid()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm_part, rest = stat_file.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        pid = int(stat_file.parent.name)
        comm = comm_part.split("(", 1)[1]
        if fields[0] == "Z" and int(fields[1]) == me and comm in names:
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


def _terminate(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM the pids, wait up to ``timeout`` s for them to go, then SIGKILL the rest."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class SlurmHarnessError(RuntimeError):
    """The private cluster could not be started, or a command against it failed."""


def missing_requirements() -> str | None:
    """Why a local cluster cannot be started here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the local SLURM harness needs root (munged/slurmctld/slurmd run as root)"
    missing = [name for name in DAEMONS + CLIENT_TOOLS if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if not missing and not _libpmix_installed():
        missing = ["libpmix.so (libpmix-dev; without it srun --mpi=pmix steps time out)"]
    if missing:
        return ("SLURM not installed (missing: " + ", ".join(missing) + "); install with "
                "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client "
                "munge libpmix-dev")
    return None


def _libpmix_installed() -> bool:
    """slurm's mpi_pmix plugin dlopens the unversioned libpmix.so that libpmix-dev provides."""
    dirs = [Path("/usr/lib"), Path("/usr/lib64"), *Path("/usr/lib").glob("*-linux-gnu")]
    return any((d / "libpmix.so").exists() for d in dirs)


def _which(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidate = Path("/usr/sbin", name)  # daemons live in sbin, which may not be on PATH
    if candidate.exists():
        return str(candidate)
    raise SlurmHarnessError(f"{name} not found on PATH or in /usr/sbin")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class LocalSlurm:
    """munged + slurmctld + slurmd with all state under ``base``. A context manager."""

    def __init__(self, base: str | os.PathLike, cpus: int = 16, mem_mb: int = 16000,
                 ctld_port: int | None = None, slurmd_port: int | None = None,
                 reap: bool = True) -> None:
        self.base = Path(base).resolve()
        self.cpus = cpus
        self.mem_mb = mem_mb
        self.ctld_port = ctld_port
        self.slurmd_port = slurmd_port
        self.reap = reap  # adopt and reap the daemons (False when they must outlive us)
        self._subreaper = False
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.pid_files = {  # stop order: slurmd, slurmctld, munged
            "slurmd": self.base / "slurmd.pid",
            "slurmctld": self.base / "slurmctld.pid",
            "munged": self.base / "munge" / "munged.pid",
        }

    # ---- environment -------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF pointing at this cluster (pass to subprocess calls)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        # a job's own SLURM_* variables would confuse sbatch/srun run from inside a job
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]
        return env

    def client_command(self, argv: Sequence[str]) -> list[str]:
        """A client command (sbatch, scontrol, ...) as it must run to reach slurmctld."""
        return list(argv)

    def _run(self, argv: Sequence[str], timeout: float = 30, check: bool = True,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.client_command(argv),
                              env=dict(env) if env is not None else self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise SlurmHarnessError(f"{' '.join(argv)} exited {proc.returncode}:\n"
                                    f"{proc.stdout}{proc.stderr}\n{self.log_tail()}")
        return proc

    # ---- start / stop ------------------------------------------------------------------------
    def start(self, timeout: float = 30) -> "LocalSlurm":
        reason = missing_requirements()
        if reason:
            raise SlurmHarnessError(reason)
        if self.running_pids():
            raise SlurmHarnessError(f"daemons already running from {self.base}: "
                                    f"{self.running_pids()}; stop them first")
        for sub in ("state", "spool", "log", "munge"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base / "munge", 0o700)
        if self.reap:
            self._subreaper = _set_child_subreaper(True)
        try:
            self._start_munged()
            self._write_conf()
            self._start_daemons()
            self._wait_idle(timeout)
            # readiness probe: a real one-task step
            self._run(["srun", "-n1", "-t1", "true"], timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_daemons(self) -> None:
        self._run([_which("slurmctld"), "-c", "-f", str(self.conf)])  # -c: clean state
        self._run([_which("slurmd"), "-f", str(self.conf)])

    def _start_munged(self) -> None:
        key = self.base / "munge" / "munge.key"
        if not key.exists() or key.stat().st_size == 0:
            key.write_bytes(secrets.token_bytes(1024))  # our own key: /etc/munge is not needed
            os.chmod(key, 0o400)
        self._run([_which("munged"), "--force", f"--key-file={key}",
                   f"--socket={self.munge_socket}",
                   f"--pid-file={self.pid_files['munged']}",
                   f"--log-file={self.base / 'log' / 'munged.log'}",
                   f"--seed-file={self.base / 'munge' / 'munged.seed'}"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.is_socket():
            if time.monotonic() > deadline:
                raise SlurmHarnessError(f"munged did not create {self.munge_socket}\n"
                                        f"{self.log_tail()}")
            time.sleep(0.05)
        cred = self._run(["munge", "-n", "-S", str(self.munge_socket)]).stdout
        probe = subprocess.run(["unmunge", "-S", str(self.munge_socket)], input=cred,
                               capture_output=True, text=True, timeout=10)
        if probe.returncode != 0:
            raise SlurmHarnessError(f"munge round trip failed: {probe.stderr}")

    def _write_conf(self) -> None:
        ctld_port = self.ctld_port or _free_port()
        slurmd_port = self.slurmd_port or _free_port()
        while slurmd_port == ctld_port:
            slurmd_port = _free_port()
        (self.base / "plugstack.conf").touch()
        self.conf.write_text(SLURM_CONF_TEMPLATE.format(
            base=self.base, host=self.host, cpus=self.cpus, mem_mb=self.mem_mb,
            ctld_port=ctld_port, slurmd_port=slurmd_port))

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self._run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
            if state and set(state.split()) == {"idle"}:  # every node
                return
            time.sleep(0.2)
        raise SlurmHarnessError(f"node not idle after {timeout} s (state {state!r})\n"
                                f"{self.log_tail()}")

    def running_pids(self) -> dict[str, int]:
        """Our daemons that are alive, by name (from their pid files, checked against /proc)."""
        found = {}
        for name, pid_file in self.pid_files.items():
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            if _alive(pid) and _process_name(pid) == name:
                found[name] = pid
        return found

    def stop(self, timeout: float = 15) -> None:
        """Cancel our jobs, stop slurmd, slurmctld and munged by PID (SIGKILL if stuck), then
        kill any job processes left behind (slurmstepd trees started from this base)."""
        if self.conf.exists() and "slurmctld" in self.running_pids():
            jobs = self._run(["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.split()
            if jobs:
                self._run(["scancel", "--full", "--quiet", *jobs], check=False, timeout=10)
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline and self._run(
                        ["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.strip():
                    time.sleep(0.2)
        for name, pid in self.running_pids().items():
            _terminate([pid], timeout)
        for pid_file in self.pid_files.values():
            pid_file.unlink(missing_ok=True)
        _terminate(self.stray_pids(), timeout)
        if self._subreaper:
            _reap_zombie_children(DAEMONS + ("slurmstepd",))
            _set_child_subreaper(False)
            self._subreaper = False

    def stray_pids(self) -> list[int]:
        """Live processes of this cluster: those working in our base (the daemons, slurmstepd),
        batch scripts in our spool, and all their descendants; never this process's ancestors."""
        base, spool = str(self.base) + os.sep, str(self.base / "spool") + os.sep
        children: dict[int, list[int]] = {}
        roots = []
        ancestors, pid = set(), os.getpid()
        while pid > 1:  # never ourselves or whatever started us
            ancestors.add(pid)
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
        for proc in Path("/proc").glob("[0-9]*"):
            pid = int(proc.name)
            if pid in ancestors or not _alive(pid):
                continue
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
                cwd = os.readlink(proc / "cwd")
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(pid)
            if (cwd + os.sep).startswith(base) or spool in cmdline:
                roots.append(pid)
        found, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, []))
        return sorted(found)

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---- jobs --------------------------------------------------------------------------------
    def submit(self, sbatch_args: Sequence[str], env: Mapping[str, str] | None = None,
               cwd: str | os.PathLike | None = None) -> str:
        """``sbatch --parsable ARGS``; returns the job id. ``env`` is added to ``self.env``."""
        full_env = self.env
        full_env.update(env or {})
        proc = subprocess.run(self.client_command(["sbatch", "--parsable", *sbatch_args]),
                              env=full_env, cwd=cwd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise SlurmHarnessError(f"sbatch {' '.join(sbatch_args)} exited {proc.returncode}: "
                                    f"{proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, ExitCode, StdOut, ...); {} if unknown."""
        out = self._run(["scontrol", "show", "job", "-o", str(job_id)], check=False).stdout
        info = {}
        for token in out.split():
            key, sep, value = token.partition("=")
            if sep:
                info.setdefault(key, value)
        return info

    def wait(self, job_id: str, timeout: float = 120, poll: float = 0.2) -> str:
        """Poll until the job leaves the active states; return its final JobState.

        On timeout the job is cancelled and SlurmHarnessError is raised."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_info(job_id).get("JobState", "")
            if state not in ACTIVE_STATES:
                return state
            if time.monotonic() > deadline:
                self._run(["scancel", "--full", str(job_id)], check=False)
                raise SlurmHarnessError(f"job {job_id} still {state or 'unknown'} after "
                                        f"{timeout} s; cancelled\n{self.log_tail()}")
            time.sleep(poll)

    def log_tail(self, lines: int = 20) -> str:
        parts = []
        for log in sorted((self.base / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log}\n" + "\n".join(text))
        return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start or stop a private single-node SLURM.")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--base", default="/tmp/mpifgl-slurm", help="directory for all state")
    parser.add_argument("--cpus", type=int, default=16, help="CPUs the node advertises")
    args = parser.parse_args(argv)
    cluster = LocalSlurm(args.base, cpus=args.cpus, reap=False)  # daemons outlive this command
    t0 = time.monotonic()
    if args.action == "up":
        try:
            cluster.start()
        except SlurmHarnessError as err:
            print(f"slurm_harness: {err}", file=sys.stderr)
            return 1
        print(f"slurm up in {time.monotonic() - t0:.1f} s: {cluster.running_pids()}")
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
        print(f"slurm down in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
