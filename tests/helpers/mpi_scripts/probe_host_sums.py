"""Run under mpirun: one ``sum_to_all`` of COUNT float64 ones; every rank checks that it got the
world size in every entry and the server writes the failures (an empty list when none) to
OUT.json.

    mpirun -n SIZE python tests/helpers/mpi_scripts/probe_host_sums.py OUT.json COUNT
"""
import json
import sys

import torch

from mpifgl.comm import world


def main(out: str, count: int) -> None:
    comm = world()
    total = comm.sum_to_all(torch.ones(count, dtype=torch.float64))
    wrong = [] if bool((total == comm.size).all()) else [f"rank {comm.rank}: {total[:4]}"]
    every = comm.gather_objects(wrong)
    if comm.is_server:
        with open(out, "w") as handle:
            json.dump(sum(every, []), handle)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
