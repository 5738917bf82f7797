"""Run under mpirun (any world size >= 2): every collective of MPICommunicator on arrays whose
result is known from the rank, with the byte counters each collective must add. Each rank
checks its own results; the server writes every rank's failures and counters to OUT.json.

    mpirun -n SIZE python tests/helpers/mpi_scripts/collectives.py OUT.json
"""
import json
import sys

import numpy as np

from mpifgl.comm import world


def main(out: str) -> None:
    comm = world()
    rank, size = comm.rank, comm.size
    failures: list[str] = []

    def check(what: str, ok: bool) -> None:
        if not ok:
            failures.append(f"rank {rank}: {what}")

    def counted(what: str, sent: int, received: int, exchange: bool = False) -> None:
        check(f"{what} bytes sent {comm.bytes_sent} != {sent}", comm.bytes_sent == sent)
        check(f"{what} bytes received {comm.bytes_received} != {received}",
              comm.bytes_received == received)
        expected = (sent, received) if exchange else (0, 0)
        check(f"{what} exchange bytes {(comm.exchange_bytes_sent, comm.exchange_bytes_received)}"
              f" != {expected}",
              (comm.exchange_bytes_sent, comm.exchange_bytes_received) == expected)
        comm.reset_counters()

    check("roles", (comm.is_server, comm.is_client, comm.client_id, comm.num_clients)
          == (rank == 0, rank != 0, rank - 1, size - 1))
    comm.reset_counters()

    # gatherv: rank r sends r + 1 float64 values 10 r, 10 r + 1, ... (counted as the exchange's)
    mine = 10.0 * rank + np.arange(rank + 1, dtype=np.float64)
    counts = np.arange(1, size + 1, dtype=np.int64)
    with comm.counting_exchange():
        gathered = comm.gatherv(mine, counts if comm.is_server else None)
    if comm.is_server:
        expected = np.concatenate([10.0 * r + np.arange(r + 1) for r in range(size)])
        check("gatherv values", np.array_equal(gathered, expected))
        counted("gatherv", 0, (expected.size - 1) * 8, exchange=True)
    else:
        check("gatherv returns None off the server", gathered is None)
        counted("gatherv", mine.nbytes, 0, exchange=True)

    # scatterv: the server's 0, 1, 2, ... cut into pieces of r + 1 float32 values
    total = int(counts.sum())
    send = np.arange(total, dtype=np.float32) if comm.is_server else None
    piece = comm.scatterv(send, counts if comm.is_server else None, rank + 1, np.float32)
    start = rank * (rank + 1) // 2
    check("scatterv values", np.array_equal(piece, np.arange(start, start + rank + 1)))
    if comm.is_server:
        counted("scatterv", (total - 1) * 4, 0)
    else:
        counted("scatterv", 0, (rank + 1) * 4)

    # reduce_sum: every rank's [r + 1] * 4 summed at the server, in the server's buffer
    buffer = np.full(4, rank + 1.0)
    summed = comm.reduce_sum(buffer)
    if comm.is_server:
        check("reduce_sum values", np.array_equal(summed, np.full(4, size * (size + 1) / 2)))
        check("reduce_sum sums in place", summed is buffer or np.shares_memory(summed, buffer))
        counted("reduce_sum", 0, 32 * (size - 1))
    else:
        check("reduce_sum returns None off the server", summed is None)
        counted("reduce_sum", 32, 0)

    # broadcast_array: the server's int64 [5, 6, 7] (its length travels first)
    values = comm.broadcast_array(np.array([5, 6, 7]) if comm.is_server else None)
    check("broadcast_array values", values.tolist() == [5, 6, 7])
    counted("broadcast_array", 32 * (size - 1) if comm.is_server else 0,
            0 if comm.is_server else 32)

    # sum_to_all: the same bits on every rank
    both = comm.sum_to_all(np.array([rank, 1], dtype=np.int64))
    check("sum_to_all values", both.tolist() == [size * (size - 1) // 2, size])
    comm.reset_counters()
    check("sum_to_server", (comm.sum_to_server(np.array([1.5])) == [1.5 * size]).all()
          if comm.is_server else comm.sum_to_server(np.array([1.5])) is None)

    # gather_equal, gather_rows, allgather_rows, gatherv_rows
    table = comm.gather_equal(np.array([rank, rank * rank], dtype=np.float64))
    rows = comm.gather_rows(np.array([rank + 0.5]))
    every = comm.allgather_rows(np.array([rank, -rank]))
    check("allgather_rows", every.tolist() == [[r, -r] for r in range(size)])
    parts = comm.gatherv_rows(np.full((rank, 2), rank, dtype=np.int64))
    if comm.is_server:
        check("gather_equal", table.tolist() == [[r, r * r] for r in range(size)])
        check("gather_rows", rows[:, 0].tolist() == [r + 0.5 for r in range(size)])
        check("gatherv_rows", [p.shape for p in parts] == [(r, 2) for r in range(size)]
              and all((p == r).all() for r, p in enumerate(parts)))
    else:
        check("gathers return None off the server", table is None and rows is None
              and parts is None)

    # objects and errors
    check("broadcast_object", comm.broadcast_object({"a": 1} if comm.is_server else None)
          == {"a": 1})
    mine_object = comm.scatter_objects([f"to {r}" for r in range(size)] if comm.is_server
                                       else None)
    check("scatter_objects", mine_object == f"to {rank}")
    errors = comm.agree_on_errors("bad shard" if rank == size - 1 else None)
    check("agree_on_errors", errors == [(size - 1, size - 2, "bad shard")])
    comm.reset_counters()
    counted("reset_counters", 0, 0)

    reports = comm.gather_objects({"rank": rank, "failures": failures})
    if comm.is_server:
        with open(out, "w") as handle:
            json.dump({"size": size, "ranks": reports}, handle)


if __name__ == "__main__":
    main(sys.argv[1])
