"""Run under mpirun: the real entry point, but client 1 raises in its 2nd training step, to check
that an exception on one rank aborts the whole job instead of hanging the others.

    mpirun -n 3 python tests/helpers/mpi_scripts/raise_on_client.py [mpifgl.train flags]
"""
import sys

from mpifgl import train, trainer

original_step = trainer.Trainer.train_step
calls = {"count": 0}


def failing_step(self):
    calls["count"] += 1
    if self.comm.client_id == 1 and calls["count"] == 2:
        raise RuntimeError("injected failure on client 1")
    return original_step(self)


trainer.Trainer.train_step = failing_step
sys.exit(train.main(sys.argv[1:]))
