"""Run under mpirun by benchmarks/bench_network.py, with the ranks laid out as its training runs:
what one collective and one byte cost across the hosts, through the program's own communicator
(mpifgl.comm, the same non-blocking collectives the training uses).

    mpirun -n SIZE [host options] python benchmarks/link_probe.py OUT.json BYTES_PER_RANK

latency: the wall time of one small collective, from ROUNDS sums to every rank of one float64
(each a reduce to the server and a broadcast back: two collectives), divided by their count.
bandwidth: bytes per second that cross between hosts when every client sends BYTES_PER_RANK to
the server at once (one gather), counting only the ranks on other hosts than the server's; the
best of three. The server writes both to OUT.json.
"""
import json
import sys
import time

import torch

from mpifgl.comm import world

ROUNDS = 200
WARM_UP = 20
REPEATS = 3


def main(out: str, bytes_per_rank: int) -> None:
    comm = world()
    one = torch.zeros(1, dtype=torch.float64)
    for _ in range(WARM_UP):
        comm.sum_to_all(one)
    start = time.perf_counter()
    for _ in range(ROUNDS):
        comm.sum_to_all(one)
    latency = (time.perf_counter() - start) / (2 * ROUNDS)
    payload = torch.ones(max(1, bytes_per_rank // 8), dtype=torch.float64)
    remote = sum(1 for host in comm.hosts[1:] if host != comm.hosts[0])
    best = float("inf")
    for _ in range(REPEATS):
        comm.sum_to_all(one)  # every rank starts the gather together
        start = time.perf_counter()
        comm.gather_equal(payload)
        best = min(best, time.perf_counter() - start)
    if comm.is_server:
        crossing = remote * payload.numel() * 8
        with open(out, "w") as handle:
            json.dump({"latency_seconds": latency, "bandwidth_bytes_per_second":
                       crossing / best if crossing else None, "crossing_bytes": crossing,
                       "hosts": comm.hosts}, handle)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
