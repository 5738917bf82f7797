"""Run under mpirun: the real entry point with a server that takes SECONDS to write each
checkpoint while the clients wait for it in a collective (a slow file system), to check that a
busy rank is no stall for the watchdog.

    mpirun -n 3 python tests/helpers/mpi_scripts/slow_checkpoint.py SECONDS [mpifgl.train flags]
"""
import sys
import time

from mpifgl import runlog, train

SECONDS = float(sys.argv[1])
write = runlog.RunDirectory.save_torch


def slow_write(self, file_name, payload):
    if file_name == runlog.CHECKPOINT_NAME:
        time.sleep(SECONDS)
    return write(self, file_name, payload)


runlog.RunDirectory.save_torch = slow_write
sys.exit(train.main(sys.argv[2:]))
