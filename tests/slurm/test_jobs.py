"""The SLURM job scripts in jobs/: dry runs and variable checks (plain bash, always run), then
real submissions to a private single-node cluster (tests/helpers/slurm.py; those skip when SLURM
is not installed or we are not root). A missing program or job script fails a test, never skips.

The mechanics (launchers, repo discovery, job arrays, failure propagation) are tested with small
stand-ins for data_prep / mpifgl.train / study passed through MPIFGL_*_CMD; the last
tests run the real programs on Cora.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from fgl_common.shard_format import default_shard_dir
from tests.helpers import REPO, require_shared_data
from tests.helpers.slurm import LocalSlurm, missing_requirements

pytestmark = pytest.mark.timeout(60)

JOBS = REPO / "jobs"
VENV = REPO / ".venv"
PY = VENV / "bin" / "python"
# Variables the scripts read: never inherit them from the shell running pytest.
SCRIPT_VARS = ("DATASET", "GRAPH", "GRAPH_NAME", "DATA_PREP_FLAGS", "NUM_CLIENTS", "PARTITION", "SEED", "DATA_ROOT", "SHARD_DIR", "FORCE",
               "RUN_DIR", "ALGO", "EPOCHS", "EXTRA_ARGS", "PREPARE", "PREP_SEED", "MPI_LAUNCHER",
               "SRUN_MPI", "MPIRUN", "VENV", "PYTHON", "DRY_RUN", "DATASETS", "REPORT_DIR",
               "CONFIGS", "TASK_ID", "SHARD_ROOT", "RUN_ROOT", "OMP_NUM_THREADS")


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in SCRIPT_VARS and not k.startswith(("SLURM_", "MPIFGL_"))}
    env.update(overrides)
    return env


def dry_run(script: str, cwd: Path = REPO, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(JOBS / script)], env=clean_env(DRY_RUN="1", **variables),
                          cwd=cwd, capture_output=True, text=True, timeout=30)


def commands(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("+ ")]


ROOT_EXPORTS = (["+ export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
                if os.geteuid() == 0 else [])
MPIRUN_EXPORTS = ["+ export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe", *ROOT_EXPORTS]


# What every script prints first: the venv, one thread per rank, the repository.
PREAMBLE = [f"+ source {VENV}/bin/activate", "+ export OMP_NUM_THREADS=1", f"+ cd {REPO}"]


# ---- dry runs: no SLURM needed -------------------------------------------------------------------
def test_data_prep_dry_run_prints_exact_commands(tmp_path):
    proc = dry_run("data_prep.sbatch", DATASET="cora", NUM_CLIENTS="2", PARTITION="metis",
                   SEED="3", DATA_ROOT=str(tmp_path), SHARD_DIR=str(tmp_path / "shards"),
                   FORCE="1")
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout) == [
        *PREAMBLE,
        f"+ {PY} -m data_prep --dataset cora --num-clients 2 --partition metis --seed 3 "
        f"--data-root {tmp_path} --out {tmp_path}/shards --force",
    ]
    assert not (tmp_path / "shards").exists()


def test_data_prep_dry_run_of_a_users_graph(tmp_path):
    graph = tmp_path / "my-graph.npz"
    graph.write_bytes(b"")  # a dry run only names it
    assignment = tmp_path / "clients.npy"
    assignment.write_bytes(b"")
    proc = dry_run("data_prep.sbatch", GRAPH=str(graph), NUM_CLIENTS="4",
                   PARTITION=f"file:{assignment}", DATA_PREP_FLAGS="--quiet")
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout)[-1] == (
        f"+ {PY} -m data_prep --graph {graph} --num-clients 4 --partition file:{assignment} "
        f"--seed 0 --out {REPO / default_shard_dir('my-graph', 4, 'file')} --quiet")
    dirichlet = dry_run("data_prep.sbatch", GRAPH=str(graph), GRAPH_NAME="mine",
                        PARTITION="dirichlet", DATA_PREP_FLAGS="--beta 0.5")
    assert commands(dirichlet.stdout)[-1].endswith(
        f"--graph {graph} --graph-name mine --num-clients 8 --partition dirichlet --seed 0 "
        f"--out {REPO / default_shard_dir('mine', 8, 'dirichlet')} --beta 0.5")


@pytest.mark.parametrize("variables, message", [
    ({"GRAPH": "/nonexistent/g.npz"}, "GRAPH='/nonexistent/g.npz' does not exist: expected an "
                                      ".npz, a .pt or an OGB folder"),
    ({"GRAPH": "/", "DATASET": "cora"}, "DATASET='cora' and GRAPH='/' are both set"),
    ({"DATASET": "cora", "PARTITION": "spectral"}, "PARTITION='spectral' is not one of: random "
                                                   "label-skew metis dirichlet louvain file:PATH"),
    ({"DATASET": "cora", "PARTITION": "file:/nonexistent/a.npy"},
     "the assignment file '/nonexistent/a.npy' is not readable"),
])
def test_data_prep_job_names_a_bad_graph_or_partition(tmp_path, variables, message):
    proc = dry_run("data_prep.sbatch", DATA_ROOT=str(tmp_path), **variables)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_data_prep_default_out_is_the_one_default_shard_directory(tmp_path):
    done = dry_run("data_prep.sbatch", DATASET="cora", NUM_CLIENTS="8", DATA_ROOT=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"--out {REPO / default_shard_dir('cora', 8)}" in done.stdout


def test_data_prep_dry_run_defaults(tmp_path):
    proc = dry_run("data_prep.sbatch", cwd=tmp_path, DATASET="synthetic", DATA_ROOT=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout)[-1] == (
        f"+ {PY} -m data_prep --dataset synthetic --num-clients 8 --partition random --seed 0 "
        f"--data-root {tmp_path} --out {REPO}/shards/synthetic-random-m8-s0")


def test_train_dry_run_mpirun_with_prepare(tmp_path):
    shards = tmp_path / "shards"
    proc = dry_run("train.sbatch", SHARD_DIR=str(shards), RUN_DIR=str(tmp_path / "run"),
                   ALGO="ours", EPOCHS="5", SEED="7", EXTRA_ARGS="--lr 0.01  --hidden 64",
                   PREPARE="1", DATASET="cora", NUM_CLIENTS="2", DATA_ROOT=str(tmp_path),
                   MPI_LAUNCHER="mpirun")
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout) == [
        *PREAMBLE,
        f"+ {PY} -m data_prep --dataset cora --num-clients 2 --partition random --seed 7 "
        f"--data-root {tmp_path} --out {shards}",
        *MPIRUN_EXPORTS,
        f"+ {VENV}/bin/mpirun -n 3 {PY} -m mpifgl.train --shards {shards} --out {tmp_path}/run "
        "--algo ours --seed 7 --device auto --threads auto --epochs 5 --lr 0.01 --hidden 64",
    ]


def test_train_dry_run_centralized_runs_one_plain_process(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"num_clients": 8}))
    proc = dry_run("train.sbatch", SHARD_DIR=str(tmp_path), RUN_DIR=str(tmp_path / "run"),
                   ALGO="centralized", SLURM_NTASKS="1")
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout)[-1] == (
        f"+ {PY} -m mpifgl.train --shards {tmp_path} --out {tmp_path}/run --algo centralized "
        "--seed 0 --device auto --threads auto")


def test_train_dry_run_srun_reads_clients_from_manifest(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"num_clients": 4}))
    proc = dry_run("train.sbatch", SHARD_DIR=str(shards), MPI_LAUNCHER="srun")
    if shutil.which("srun") is None:
        assert proc.returncode == 2 and "MPI_LAUNCHER=srun but srun is not on PATH" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout) == [
        *PREAMBLE,
        f"+ srun --mpi=pmix --kill-on-bad-exit=1 -n 5 {PY} -m mpifgl.train --shards {shards} "
        f"--out {REPO}/runs/shards-ours-s0 --algo ours --seed 0 --device auto --threads auto",
    ]


def test_train_dry_run_auto_outside_slurm_uses_mpirun(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    proc = dry_run("train.sbatch", SHARD_DIR=str(shards), VENV=str(VENV))
    assert proc.returncode == 0, proc.stderr
    assert "MPI_LAUNCHER=auto chose mpirun" in proc.stderr
    assert commands(proc.stdout)[-1].startswith(f"+ {VENV}/bin/mpirun -n 3 {PY} -m mpifgl.train")


def test_train_dry_run_passes_device_and_threads_and_refuses_bad_ones(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    proc = dry_run("train.sbatch", SHARD_DIR=str(tmp_path), RUN_DIR=str(tmp_path / "run"),
                   MPI_LAUNCHER="mpirun", DEVICE="cuda:1", THREADS="4", SLURM_CPUS_PER_TASK="4")
    assert proc.returncode == 0, proc.stderr
    assert "+ export OMP_NUM_THREADS=4" in commands(proc.stdout)
    assert commands(proc.stdout)[-1].endswith("--device cuda:1 --threads 4")
    for name, value in (("DEVICE", "gpu"), ("THREADS", "0")):
        bad = dry_run("train.sbatch", SHARD_DIR=str(tmp_path), **{name: value})
        assert bad.returncode == 2 and f"{name}='{value}'" in bad.stderr


def test_study_dry_run(tmp_path):
    proc = dry_run("study.sbatch", DATASETS="cora,citeseer", REPORT_DIR=str(tmp_path / "rep"),
                   EXTRA_ARGS="--seeds 0,1")
    assert proc.returncode == 0, proc.stderr
    assert commands(proc.stdout) == [
        f"+ source {VENV}/bin/activate",
        "+ export OMP_NUM_THREADS=1",
        *MPIRUN_EXPORTS,
        f"+ cd {REPO}",
        f"+ {PY} -m study --datasets cora,citeseer --out {tmp_path}/rep --seeds 0,1",
    ]
    default = dry_run("study.sbatch")
    assert commands(default.stdout)[-1] == (
        f"+ {PY} -m study --datasets cora,citeseer,amazon-computers,coauthor-cs "
        f"--out {REPO}/reports/study")


def test_study_array_dry_run_shows_every_task(tmp_path):
    configs = tmp_path / "configs.txt"
    configs.write_text("# dataset clients partition algo seed args\n"
                       "cora 2 random ours 0 --lr 0.01\n\n"
                       "citeseer 4 metis centralized 1\n")
    proc = dry_run("study_array.sbatch", CONFIGS=str(configs), SHARD_ROOT=str(tmp_path / "s"),
                   RUN_ROOT=str(tmp_path / "r"), DATA_ROOT=str(tmp_path), EPOCHS="2",
                   MPI_LAUNCHER="mpirun")
    assert proc.returncode == 0, proc.stderr
    launches = [c for c in commands(proc.stdout) if " -m mpifgl.train " in c]
    assert launches == [
        f"+ {VENV}/bin/mpirun -n 3 {PY} -m mpifgl.train --shards {tmp_path}/s/cora-random-m2-s0 "
        f"--out {tmp_path}/r/cora-random-m2-ours-s0 --algo ours --seed 0 --device auto "
        "--threads auto --epochs 2 --lr 0.01",
        f"+ {PY} -m mpifgl.train --shards {tmp_path}/s/citeseer-metis-m4-s0 "
        f"--out {tmp_path}/r/citeseer-metis-m4-centralized-s1 --algo centralized --seed 1 "
        "--device auto --threads auto --epochs 2",
    ]
    assert "sbatch --array=0-1" in proc.stderr
    one = dry_run("study_array.sbatch", CONFIGS=str(configs), TASK_ID="1", DATA_ROOT=str(tmp_path))
    assert one.returncode == 0, one.stderr
    assert [c for c in commands(one.stdout) if " -m mpifgl.train " in c][0].count("citeseer") == 2


BAD_VARIABLES = [
    ("data_prep.sbatch", {}, "DATASET is required but not set"),
    ("data_prep.sbatch", {"DATASET": "cora", "NUM_CLIENTS": "two"},
     "NUM_CLIENTS='two' is not a whole number"),
    ("data_prep.sbatch", {"DATASET": "cora", "NUM_CLIENTS": "0"}, "NUM_CLIENTS=0 must be at least 1"),
    ("data_prep.sbatch", {"DATASET": "cora", "DATA_ROOT": "/no/such/dir"},
     "DATA_ROOT='/no/such/dir' is not a directory"),
    ("data_prep.sbatch", {"DATASET": "cora", "VENV": "/no/such/venv"},
     "VENV='/no/such/venv' is not a virtualenv"),
    ("data_prep.sbatch", {"DATASET": "cora", "DRY_RUN": "yes"}, "DRY_RUN='yes' is not one of: 0 1"),
    ("train.sbatch", {}, "SHARD_DIR is required but not set"),
    ("train.sbatch", {"SHARD_DIR": "/no/shards"}, "SHARD_DIR='/no/shards' has no manifest.json"),
    ("train.sbatch", {"SHARD_DIR": "/no/shards", "PREPARE": "1", "DATASET": "cora"},
     "NUM_CLIENTS is required but not set"),
    ("train.sbatch", {"SHARD_DIR": "/no/shards", "EPOCHS": "ten"}, "EPOCHS='ten' is not a whole number"),
    ("train.sbatch", {"SHARD_DIR": "/x", "PREPARE": "1", "DATASET": "cora", "NUM_CLIENTS": "8",
                      "SLURM_NTASKS": "3"},
     "NUM_CLIENTS=8 needs 1 server + 8 clients = 9 ranks but the allocation has SLURM_NTASKS=3"),
    ("train.sbatch", {"SHARD_DIR": "/x", "PREPARE": "1", "DATASET": "cora", "NUM_CLIENTS": "2",
                      "MPI_LAUNCHER": "mpiexec"},
     "MPI_LAUNCHER='mpiexec' is not one of: auto srun mpirun"),
    ("study.sbatch", {"DATASETS": "cora citeseer"},
     "DATASETS='cora citeseer' is not a comma-separated list"),
    ("study_array.sbatch", {}, "CONFIGS is required but not set"),
    ("study_array.sbatch", {"CONFIGS": "/no/configs.txt"}, "CONFIGS='/no/configs.txt' is not a file"),
]


@pytest.mark.parametrize("script,variables,message", BAD_VARIABLES,
                         ids=[f"{s}-{m.split()[0]}" for s, _, m in BAD_VARIABLES])
def test_bad_variable_fails_before_any_command(script, variables, message, tmp_path):
    variables.setdefault("DATA_ROOT", str(tmp_path))
    variables.setdefault("DRY_RUN", "1")
    proc = subprocess.run(["bash", str(JOBS / script)], env=clean_env(**variables), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert f"{script}: error:" in proc.stderr
    assert commands(proc.stdout) == []


def test_train_rejects_manifest_mismatch(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"num_clients": 4}))
    proc = dry_run("train.sbatch", SHARD_DIR=str(tmp_path), NUM_CLIENTS="2")
    assert proc.returncode == 2
    assert f"NUM_CLIENTS=2 but {tmp_path}/manifest.json has num_clients=4" in proc.stderr


def test_scripts_need_the_repo_when_copied_away(tmp_path):
    """A copy of a script outside the repo (like sbatch's spool copy) with nothing to go on
    fails with a clear message; MPIFGL_HOME fixes it."""
    copy = tmp_path / "slurm_script"
    shutil.copy(JOBS / "data_prep.sbatch", copy)
    env = clean_env(DATASET="cora", DRY_RUN="1", DATA_ROOT=str(tmp_path))
    lost = subprocess.run(["bash", str(copy)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30)
    assert lost.returncode == 2
    assert "cannot find the mpifgl repository" in lost.stderr and "MPIFGL_HOME" in lost.stderr
    found = subprocess.run(["bash", str(copy)], env={**env, "MPIFGL_HOME": str(REPO)},
                           cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    found_by_submit_dir = subprocess.run(["bash", str(copy)],
                                         env={**env, "SLURM_SUBMIT_DIR": str(REPO / "jobs")},
                                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert found_by_submit_dir.returncode == 0, found_by_submit_dir.stderr


def test_scripts_pass_bash_syntax_check():
    for script in sorted(JOBS.glob("*.sbatch")) + [JOBS / "common.sh"]:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                              timeout=10)
        assert proc.returncode == 0, (script, proc.stderr)


# ---- real submissions to a private cluster -------------------------------------------------------
FAKE_DATA_PREP = '''
"""Stand-in for `python -m data_prep`: writes a manifest and empty client files."""
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("--dataset", "--partition", "--data-root", "--out"):
    p.add_argument(flag, required=True)
p.add_argument("--num-clients", type=int, required=True)
p.add_argument("--seed", type=int, required=True)
p.add_argument("--force", action="store_true")
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
for i in range(a.num_clients):
    open(os.path.join(a.out, f"client_{i}.h5"), "wb").close()
json.dump({"num_clients": a.num_clients, "dataset": a.dataset, "partition": a.partition,
           "seed": a.seed, "omp": os.environ.get("OMP_NUM_THREADS")},
          open(os.path.join(a.out, "manifest.json"), "w"))
print("fake data_prep wrote", a.out)
'''

FAKE_TRAIN = '''
"""Stand-in for `python -m mpifgl.train`: checks the world size against the manifest, then
rank 0 writes config.json / final.json. FAIL_RANK=r makes rank r exit 3."""
import argparse, json, os, socket, sys
from mpi4py import MPI
p = argparse.ArgumentParser()
p.add_argument("--shards", required=True); p.add_argument("--out", required=True)
p.add_argument("--algo", required=True); p.add_argument("--seed", type=int, required=True)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--device", required=True); p.add_argument("--threads", required=True)
a, extra = p.parse_known_args()
comm = MPI.COMM_WORLD
m = json.load(open(os.path.join(a.shards, "manifest.json")))["num_clients"]
expected = 1 if a.algo == "centralized" else m + 1  # centralized: one plain process
if comm.size != expected:
    print(f"world size {comm.size} != {expected} for {a.algo} with {m} clients", file=sys.stderr)
    comm.Abort(4)
if os.environ.get("FAIL_RANK") == str(comm.rank):
    print(f"rank {comm.rank} failing on purpose", file=sys.stderr, flush=True)
    os._exit(3)  # a crash: no MPI_Finalize, the other ranks wait in allreduce
total = comm.allreduce(comm.rank)
if comm.rank == 0:
    os.makedirs(a.out, exist_ok=True)
    result = {"world_size": comm.size, "rank_sum": total, "algo": a.algo, "seed": a.seed,
              "epochs": a.epochs, "device": a.device, "threads": a.threads,
              "extra": extra, "omp": os.environ.get("OMP_NUM_THREADS"),
              "slurm_job": os.environ.get("SLURM_JOB_ID"),
              "launched_by_srun": "SLURM_STEP_ID" in os.environ and "PMIX_RANK" in os.environ}
    json.dump(vars(a), open(os.path.join(a.out, "config.json"), "w"))
    json.dump(result, open(os.path.join(a.out, "final.json"), "w"))
    print("fake train done", result, flush=True)
'''

FAKE_STUDY = '''
"""Stand-in for `python -m study`."""
import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument("--datasets", required=True); p.add_argument("--out", required=True)
a, extra = p.parse_known_args()
os.makedirs(a.out, exist_ok=True)
json.dump({"datasets": a.datasets.split(","), "extra": extra},
          open(os.path.join(a.out, "report.json"), "w"))
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("slurm")
    slurm = LocalSlurm(base, cpus=16)
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()
        assert slurm.running_pids() == {}, f"daemons left running: {slurm.running_pids()}"
        leftovers = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True,
                                   text=True, timeout=10).stdout
        live = [line for line in leftovers.splitlines()
                if str(base) in line and " Z" not in line]
        assert not live, f"processes left behind: {live}"


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fakes")
    for name, code in (("fake_data_prep.py", FAKE_DATA_PREP), ("fake_train.py", FAKE_TRAIN),
                       ("fake_study.py", FAKE_STUDY)):
        (folder / name).write_text(textwrap.dedent(code))
    return {
        "MPIFGL_DATA_PREP_CMD": f"{PY} {folder / 'fake_data_prep.py'}",
        "MPIFGL_TRAIN_CMD": f"{PY} {folder / 'fake_train.py'}",
        "MPIFGL_STUDY_CMD": f"{PY} {folder / 'fake_study.py'}",
    }


def submit_and_wait(cluster: LocalSlurm, script: str, out_dir: Path, variables: dict[str, str],
                    sbatch_args: tuple[str, ...] = (), cwd: Path = REPO,
                    timeout: float = 40) -> tuple[str, str]:
    """sbatch a script from jobs/ with a clean environment; return (final state, job output)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = clean_env(SLURM_CONF=str(cluster.conf), **variables)
    proc = subprocess.run(["sbatch", "--parsable", "-o", str(out_dir / "%x-%j.out"),
                           *sbatch_args, str(JOBS / script)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    state = cluster.wait(job_id, timeout=timeout)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(out_dir.glob(f"*-{job_id}*.out")))
    return state, logs


@pytest.mark.slurm
def test_sbatch_data_prep_then_train_stand_ins(cluster, fakes, tmp_path):
    shards, run = tmp_path / "shards", tmp_path / "run"
    state, log = submit_and_wait(cluster, "data_prep.sbatch", tmp_path / "log",
                                 {**fakes, "DATASET": "cora", "NUM_CLIENTS": "2",
                                  "SHARD_DIR": str(shards), "DATA_ROOT": str(tmp_path)})
    assert state == "COMPLETED", log
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["num_clients"] == 2 and manifest["omp"] == "2"  # --cpus-per-task=2
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {**fakes, "SHARD_DIR": str(shards), "RUN_DIR": str(run),
                                  "EPOCHS": "2", "EXTRA_ARGS": "--lr 0.5"}, ("-n", "3"))
    assert state == "COMPLETED", log
    assert "MPI_LAUNCHER=auto chose srun" in log
    final = json.loads((run / "final.json").read_text())
    assert final["world_size"] == 3 and final["rank_sum"] == 3 and final["omp"] == "1"
    assert final["epochs"] == 2 and final["extra"] == ["--lr", "0.5"]
    assert (final["device"], final["threads"]) == ("auto", "auto")
    assert final["launched_by_srun"] is True


@pytest.mark.slurm
def test_sbatch_train_with_mpirun_and_prepare_from_another_dir(cluster, fakes, tmp_path):
    """Submitted from outside the repo without MPIFGL_HOME: the script finds the repo from the
    path SLURM recorded; PREPARE=1 makes the shards; the venv's mpirun runs 5 ranks in a 9-task
    allocation on a 2-CPU machine."""
    shards, run = tmp_path / "shards", tmp_path / "run"
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {**fakes, "SHARD_DIR": str(shards), "RUN_DIR": str(run),
                                  "PREPARE": "1", "DATASET": "cora", "NUM_CLIENTS": "4",
                                  "DATA_ROOT": str(tmp_path), "MPI_LAUNCHER": "mpirun"},
                                 cwd=tmp_path)
    assert state == "COMPLETED", log
    assert "using 5 of the 9 allocated tasks" in log
    final = json.loads((run / "final.json").read_text())
    assert final["world_size"] == 5 and final["launched_by_srun"] is False


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_sbatch_train_failing_rank_fails_the_job(cluster, fakes, tmp_path, launcher):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {**fakes, "SHARD_DIR": str(shards), "RUN_DIR": str(tmp_path / "r"),
                                  "MPI_LAUNCHER": launcher, "FAIL_RANK": "1"}, ("-n", "3"))
    assert state == "FAILED", log
    assert "rank 1 failing on purpose" in log
    assert not (tmp_path / "r" / "final.json").exists()


@pytest.mark.slurm
def test_sbatch_bad_variable_fails_with_message(cluster, tmp_path):
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {"SHARD_DIR": str(tmp_path / "missing")})
    assert state == "FAILED"
    assert f"train.sbatch: error: SHARD_DIR='{tmp_path}/missing' has no manifest.json" in log


@pytest.mark.slurm
def test_sbatch_dry_run_inside_allocation_shows_srun(cluster, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {"SHARD_DIR": str(tmp_path), "RUN_DIR": str(tmp_path / "run"),
                                  "DRY_RUN": "1"}, ("-n", "3"), cwd=REPO / "jobs")
    assert state == "COMPLETED", log
    assert commands(log)[-1] == (
        f"+ srun --mpi=pmix --kill-on-bad-exit=1 -n 3 {PY} -m mpifgl.train --shards {tmp_path} "
        f"--out {tmp_path}/run --algo ours --seed 0 --device auto --threads auto")
    assert not (tmp_path / "run").exists()


@pytest.mark.slurm
def test_sbatch_study_and_study_array_stand_ins(cluster, fakes, tmp_path):
    report = tmp_path / "report"
    state, log = submit_and_wait(cluster, "study.sbatch", tmp_path / "log",
                                 {**fakes, "DATASETS": "cora,citeseer", "REPORT_DIR": str(report),
                                  "EXTRA_ARGS": "--seeds 0,1"})
    assert state == "COMPLETED", log
    assert json.loads((report / "report.json").read_text()) == {
        "datasets": ["cora", "citeseer"], "extra": ["--seeds", "0,1"]}

    configs = tmp_path / "configs.txt"
    configs.write_text("cora 2 random ours 0\ncora 2 random centralized 1 --lr 0.1\n")
    out = tmp_path / "array-log"
    out.mkdir()
    env = clean_env(SLURM_CONF=str(cluster.conf), CONFIGS=str(configs),
                    SHARD_ROOT=str(tmp_path / "shards"), RUN_ROOT=str(tmp_path / "runs"),
                    DATA_ROOT=str(tmp_path), **fakes)
    proc = subprocess.run(["sbatch", "--parsable", "--array=0-1", "-n", "3", "-o",
                           str(out / "%x-%A_%a.out"), str(JOBS / "study_array.sbatch")],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    array_id = proc.stdout.strip()
    states = [cluster.wait(f"{array_id}_{i}", timeout=40) for i in range(2)]
    logs = "\n".join(p.read_text() for p in sorted(out.glob("*.out")))
    assert states == ["COMPLETED", "COMPLETED"], logs
    shard_runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert shard_runs == ["cora-random-m2-centralized-s1", "cora-random-m2-ours-s0"]
    central = json.loads((tmp_path / "runs" / shard_runs[0] / "final.json").read_text())
    assert central["world_size"] == 1 and central["extra"] == ["--lr", "0.1"]
    ours = json.loads((tmp_path / "runs" / shard_runs[1] / "final.json").read_text())
    assert ours["world_size"] == 3 and ours["launched_by_srun"] is True


# ---- the real programs ---------------------------------------------------------------------------
PROGRAM_FLAGS = [
    ("data_prep", ("--dataset", "--num-clients", "--partition", "--seed", "--data-root", "--out",
                   "--force")),
    ("mpifgl.train", ("--shards", "--out", "--algo", "--seed", "--epochs")),
    ("study", ("--datasets", "--out")),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("module,flags", PROGRAM_FLAGS, ids=[m for m, _ in PROGRAM_FLAGS])
def test_real_programs_accept_the_flags_the_scripts_pass(module, flags):
    """The scripts build these command lines; catch drift in the programs' CLIs early."""
    proc = subprocess.run([str(PY), "-m", module, "--help"], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stderr
    missing = [flag for flag in flags if flag not in proc.stdout]
    assert not missing, f"python -m {module} --help does not list {missing}"


@pytest.mark.slurm
@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_sbatch_real_data_prep_then_train_on_cora(cluster, tmp_path):
    # PyG writes processed/ next to raw/: load from a copy so shared/ stays clean
    data_root = tmp_path / "data"
    shutil.copytree(require_shared_data("Planetoid/Cora"), data_root / "Planetoid" / "Cora")
    shards, run = tmp_path / "shards", tmp_path / "run"
    state, log = submit_and_wait(cluster, "data_prep.sbatch", tmp_path / "log",
                                 {"DATASET": "cora", "NUM_CLIENTS": "2", "PARTITION": "random",
                                  "SEED": "0", "DATA_ROOT": str(data_root),
                                  "SHARD_DIR": str(shards)}, timeout=60)
    assert state == "COMPLETED", log
    assert (shards / "manifest.json").is_file()
    assert sorted(p.name for p in shards.glob("client_*.h5")) == ["client_0.h5", "client_1.h5"]
    state, log = submit_and_wait(cluster, "train.sbatch", tmp_path / "log",
                                 {"SHARD_DIR": str(shards), "RUN_DIR": str(run), "EPOCHS": "3"},
                                 ("-n", "3"), timeout=110)
    assert state == "COMPLETED", log
    assert "MPI_LAUNCHER=auto chose srun" in log
    assert (run / "final.json").is_file(), log
    assert json.loads((run / "final.json").read_text())
    assert (run / "config.json").is_file() and (run / "metrics.jsonl").is_file()


# ---- the README's dry-run lines, and outputs that exist already ---------------------------------
def test_the_readmes_dry_run_lines_run_as_written_without_a_cluster():
    lines = [line.split("#")[0].strip() for line in (REPO / "README.md").read_text().splitlines()
             if "DRY_RUN=1 bash jobs/" in line]
    assert len(lines) == 2, lines
    for line in lines:
        done = subprocess.run(["bash", "-c", line], env=clean_env(), cwd=REPO,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (line, done.stderr)
        assert commands(done.stdout)[-1].split()[2:4] == ["-m", "data_prep"] \
            or " -m mpifgl.train " in commands(done.stdout)[-1], done.stdout


def test_a_dry_run_reports_an_output_that_exists(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    done = dry_run("data_prep.sbatch", DATASET="cora", NUM_CLIENTS="2", DATA_ROOT=str(tmp_path),
                   SHARD_DIR=str(shards))
    assert done.returncode == 0
    assert (f"data_prep.sbatch: SHARD_DIR={shards} already holds shards (manifest.json); "
            f"data_prep will refuse to replace them") in done.stderr
    assert "already holds" not in dry_run("data_prep.sbatch", DATASET="cora", NUM_CLIENTS="2",
                                          DATA_ROOT=str(tmp_path), SHARD_DIR=str(shards),
                                          FORCE="1").stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "final.json").write_text("{}")
    done = dry_run("train.sbatch", SHARD_DIR=str(shards), RUN_DIR=str(run), MPI_LAUNCHER="mpirun")
    assert done.returncode == 0
    assert (f"train.sbatch: RUN_DIR={run} already holds a run (final.json); mpifgl.train will "
            f"refuse it") in done.stderr
    assert "already holds" not in dry_run("train.sbatch", SHARD_DIR=str(shards), RUN_DIR=str(run),
                                          MPI_LAUNCHER="mpirun", EXTRA_ARGS="--force").stderr


def test_the_venvs_activate_keeps_a_users_launch_variables(tmp_path):
    """train.sbatch sources the venv's activate script, whose Open MPI block scripts/setup.sh
    writes with `python -m fgl_common.launch --activate`: a mapping policy the user (or the
    launcher) set survives it and reaches mpirun; unset, the single-host default applies."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    block = subprocess.run([str(PY), "-m", "fgl_common.launch", "--activate"], cwd=REPO,
                           capture_output=True, text=True, timeout=30, check=True).stdout
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n{block}')
    (venv / "bin" / "python").symlink_to(PY)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"num_clients": 2}))
    policy = "PRTE_MCA_rmaps_default_mapping_policy"
    for given, expected in (("ppr:1:node:oversubscribe", "ppr:1:node:oversubscribe"),
                            (None, ":oversubscribe")):
        variables = dict(SHARD_DIR=str(shards), RUN_DIR=str(tmp_path / "run"), VENV=str(venv),
                         MPI_LAUNCHER="mpirun", MPIRUN=str(VENV / "bin" / "mpirun"))
        env = clean_env(DRY_RUN="1", **variables)
        env.pop(policy, None)
        if given is not None:
            env[policy] = given
        done = subprocess.run(["bash", str(JOBS / "train.sbatch")], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert f"+ export {policy}={expected}" in commands(done.stdout), done.stdout
