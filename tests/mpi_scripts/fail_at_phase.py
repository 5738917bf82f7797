"""Run under mpirun: the real entry point with one injected failure on one rank in one phase, to
check that every failure after MPI starts ends the whole job with one message.

    mpirun -n 3 python tests/mpi_scripts/fail_at_phase.py PHASE RANK [mpifgl.train flags]

PHASE: manifest, shard, rundir (set-up findings every rank agrees on) or setup, config, step,
evaluate, checkpoint, final (this rank alone: the job is aborted). The errors: OSError naming a
file, MemoryError (shard, setup), RuntimeError (step).
"""
import errno
import sys

from mpifgl import runlog, train, trainer

PHASE, RANK = sys.argv[1], int(sys.argv[2])


def disk_full(path=None):
    return OSError(errno.ENOSPC, "No space left on device", path)


def failing(original, error, rank_of):
    """``original``, raising ``error(*args)`` instead when ``rank_of(*args)`` is RANK."""
    def wrapper(*args, **kwargs):
        if rank_of(*args) == RANK:
            raise error(*args)
        return original(*args, **kwargs)
    return wrapper


def launcher_rank(*args):
    return train.launcher_rank()


def trainer_rank(self, *args):
    return self.comm.rank


def setup_rank(cls, config, comm, *rest):
    return comm.rank


def server_writing(original, name):
    """A RunDirectory writer failing for one file name (the server writes every run file)."""
    def wrapper(self, file_name, payload):
        if file_name == name:
            raise disk_full(str(self.path / name))
        return original(self, file_name, payload)
    return wrapper


Trainer, RankSetup, RunDirectory = trainer.Trainer, trainer.RankSetup, runlog.RunDirectory
if PHASE == "manifest":
    train.read_manifest = failing(train.read_manifest, lambda path: OSError(
        errno.EIO, "Input/output error", f"{path}/manifest.json"), launcher_rank)
elif PHASE == "shard":
    train.load_client_shard = failing(train.load_client_shard, lambda path: MemoryError(),
                                      launcher_rank)
elif PHASE == "rundir":
    train.claim_run_dir = failing(train.claim_run_dir, lambda path, *rest: OSError(
        errno.EROFS, "Read-only file system", path), launcher_rank)
elif PHASE == "setup":
    RankSetup.create = classmethod(failing(RankSetup.create.__func__,
                                           lambda cls, *rest: MemoryError(), setup_rank))
elif PHASE == "config":
    RunDirectory.write_json = server_writing(RunDirectory.write_json, "config.json")
elif PHASE == "step":
    Trainer.train_step = failing(Trainer.train_step,
                                 lambda self: RuntimeError("injected failure in a step"),
                                 trainer_rank)
elif PHASE == "evaluate":
    Trainer.evaluate = failing(Trainer.evaluate, lambda self: OSError(errno.EIO, "Input/output "
                                                                      "error"), trainer_rank)
elif PHASE == "checkpoint" and RANK == 0:
    RunDirectory.save_torch = server_writing(RunDirectory.save_torch, "checkpoint.pt")
elif PHASE == "checkpoint":
    Trainer.save_checkpoint = failing(Trainer.save_checkpoint, lambda self: disk_full(),
                                      trainer_rank)
elif PHASE == "final" and RANK == 0:
    RunDirectory.write_json = server_writing(RunDirectory.write_json, "final.json")
elif PHASE == "final":
    Trainer.finish = failing(Trainer.finish, lambda self: disk_full(), trainer_rank)
else:
    raise SystemExit(f"unknown phase {PHASE}")

sys.exit(train.main(sys.argv[3:]))
