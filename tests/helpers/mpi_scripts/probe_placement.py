"""Run under mpirun: every rank's placement as ``mpifgl.hardware.place`` decides it for
``--device DEVICE --threads auto`` on a node that shows GPUS CUDA devices (torch's CUDA queries
answered by this script, so the GPU binding logic runs on machines without one; nothing is
computed on a device). The server writes, per rank: host, device, threads, to OUT.json.

    mpirun -n SIZE python tests/helpers/mpi_scripts/probe_placement.py OUT.json DEVICE GPUS
"""
import json
import sys

import torch

from mpifgl import hardware
from mpifgl.comm import world


def pretend_gpus(count: int) -> None:
    """torch's answers for a node with ``count`` GPUs named ``pretend-gpu``."""
    torch.cuda.is_available = lambda: count > 0
    torch.cuda.device_count = lambda: count
    torch.cuda.get_device_name = lambda device=None: "pretend-gpu"


def main(out: str, device: str, gpus: int) -> None:
    pretend_gpus(gpus)
    comm = world()
    placement = hardware.place(device, "auto", comm)
    every = comm.gather_objects({"host": placement.host, "device": str(placement.device),
                                 "threads": placement.threads})
    if comm.is_server:
        with open(out, "w") as handle:
            json.dump(every, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
