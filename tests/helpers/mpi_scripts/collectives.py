"""Run under mpirun (any world size >= 2): every collective of MPICommunicator, for every dtype
it maps, on tensors whose result is known from the rank, with the byte counters each collective
must add (the exchange's share inside ``counting_exchange``). Each rank checks its own results;
the server writes every rank's failures and counters to OUT.json.

    mpirun -n SIZE python tests/helpers/mpi_scripts/collectives.py OUT.json
"""
import json
import sys

import numpy as np
import torch

from mpifgl.comm import MPI_TYPES, world


def main(out: str) -> None:
    comm = world()
    rank, size = comm.rank, comm.size
    server = comm.is_server
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

    for dtype in MPI_TYPES:
        item = dtype.itemsize
        name = str(dtype)
        inside = dtype.is_floating_point  # count half of the sweep as the exchange's
        # gatherv: rank r sends r + 1 values 10 r, 10 r + 1, ...
        mine = (10 * rank + torch.arange(rank + 1)).to(dtype)
        counts = np.arange(1, size + 1, dtype=np.int64)
        if inside:
            with comm.counting_exchange():
                gathered = comm.gatherv(mine, counts if server else None)
        else:
            gathered = comm.gatherv(mine, counts if server else None)
        check(f"gatherv {name} counted as one collective {comm.extra_counters()}",
              comm.extra_counters() == {"collectives": 1})
        if server:
            expected = torch.cat([(10 * r + torch.arange(r + 1)).to(dtype) for r in range(size)])
            check(f"gatherv {name} values", gathered.dtype == dtype
                  and torch.equal(gathered, expected))
            counted(f"gatherv {name}", 0, (expected.numel() - 1) * item, inside)
        else:
            check(f"gatherv {name} returns None off the server", gathered is None)
            counted(f"gatherv {name}", mine.numel() * item, 0, inside)

        # scatterv: the server's 0, 1, 2, ... cut into pieces of r + 1 values
        total = int(counts.sum())
        send = torch.arange(total).to(dtype) if server else None
        piece = comm.scatterv(send, counts if server else None, rank + 1, dtype)
        start = rank * (rank + 1) // 2
        check(f"scatterv {name} values", piece.dtype == dtype and torch.equal(
            piece, torch.arange(start, start + rank + 1).to(dtype)))
        counted(f"scatterv {name}", (total - 1) * item if server else 0,
                0 if server else (rank + 1) * item)

        # reduce_sum: every rank's [r + 1] * 4 summed at the server, in the server's buffer
        buffer = torch.full((4,), rank + 1).to(dtype)
        summed = comm.reduce_sum(buffer)
        if server:
            check(f"reduce_sum {name} values", torch.equal(
                summed, torch.full((4,), size * (size + 1) // 2).to(dtype)))
            check(f"reduce_sum {name} sums in place", summed.data_ptr() == buffer.data_ptr())
            counted(f"reduce_sum {name}", 0, 4 * item * (size - 1))
        else:
            check(f"reduce_sum {name} returns None off the server", summed is None)
            counted(f"reduce_sum {name}", 4 * item, 0)

        # gather_equal: [r, r + 1] from every rank
        table = comm.gather_equal(torch.tensor([rank, rank + 1]).to(dtype))
        if server:
            check(f"gather_equal {name}", table.tolist() == [[r, r + 1] for r in range(size)])
            counted(f"gather_equal {name}", 0, 2 * item * (size - 1))
        else:
            check(f"gather_equal {name} returns None off the server", table is None)
            counted(f"gather_equal {name}", 2 * item, 0)

        # sum_to_all: the same bits on every rank
        both = comm.sum_to_all(torch.tensor([rank, 1]).to(dtype))
        check(f"sum_to_all {name}", both.tolist() == [size * (size - 1) // 2, size])
        counted(f"sum_to_all {name}", 2 * item * (size - 1) if server else 2 * item,
                2 * item * (size - 1) if server else 2 * item)

        # sum_to_server
        at_server = comm.sum_to_server(torch.tensor([rank, 2]).to(dtype))
        if server:
            check(f"sum_to_server {name}", at_server.tolist() == [size * (size - 1) // 2,
                                                                  2 * size])
            counted(f"sum_to_server {name}", 0, 2 * item * (size - 1))
        else:
            check(f"sum_to_server {name} returns None off the server", at_server is None)
            counted(f"sum_to_server {name}", 2 * item, 0)

        # gatherv_rows: rank r sends r rows of width 2 holding r
        parts = comm.gatherv_rows(torch.full((rank, 2), rank).to(dtype))
        if server:
            check(f"gatherv_rows {name}", [tuple(p.shape) for p in parts]
                  == [(r, 2) for r in range(size)]
                  and all(bool((p == r).all()) for r, p in enumerate(parts)))
            counted(f"gatherv_rows {name}", 0, sum(range(size)) * 2 * item)
        else:
            check(f"gatherv_rows {name} returns None off the server", parts is None)
            counted(f"gatherv_rows {name}", rank * 2 * item, 0)

    # the fixed-type collectives: int64 broadcast, max and allgather, float64 row gather
    values = comm.broadcast_array(torch.tensor([5, 6, 7]) if server else None)
    check("broadcast_array values", values.tolist() == [5, 6, 7])
    counted("broadcast_array", 32 * (size - 1) if server else 0, 0 if server else 32)
    largest = comm.max_to_all(torch.tensor([rank, -rank]))
    check("max_to_all", largest.tolist() == [size - 1, 0])
    counted("max_to_all", 16, 16)
    every = comm.allgather_rows(torch.tensor([rank, -rank]))
    check("allgather_rows", every.tolist() == [[r, -r] for r in range(size)])
    counted("allgather_rows", 16, 16 * size)
    rows = comm.gather_rows(torch.tensor([rank + 0.5]))
    if server:
        check("gather_rows", rows[:, 0].tolist() == [r + 0.5 for r in range(size)])
        counted("gather_rows", 0, 8 * (size - 1))
    else:
        check("gather_rows returns None off the server", rows is None)
        counted("gather_rows", 8, 0)
    try:
        comm.gatherv(torch.zeros(2, dtype=torch.bool), None)
        check("an unmapped dtype is refused", False)
    except ValueError as exc:
        check("an unmapped dtype is named", "torch.bool" in str(exc))

    # groups: the client ranks by parity, ordered by descending rank; their broadcasts and
    # allreduces counted in the world's counters too, their seconds as well
    group = comm.split(rank % 2 if not server else -1, -rank)
    if server:
        check("split leaves out a negative color", group is None)
    else:
        members = sorted((r for r in range(1, size) if r % 2 == rank % 2), reverse=True)
        check("split ranks by key", (group.rank, group.size) == (members.index(rank),
                                                                  len(members)))
        for dtype in (torch.float32, torch.float64, torch.int64):
            item = dtype.itemsize
            buffer = torch.full((3,), rank).to(dtype)
            check(f"broadcast_buffer {dtype} in place",
                  group.broadcast_buffer(buffer, root=0) is buffer
                  and buffer.tolist() == [members[0]] * 3)
            root = group.rank == 0
            counted(f"broadcast_buffer {dtype}", 3 * item * (group.size - 1) if root else 0,
                    0 if root else 3 * item)
            total = torch.full((2,), rank).to(dtype)
            group.allreduce_sum(total)
            check(f"allreduce_sum {dtype}", total.tolist() == [sum(members)] * 2)
            moved = 2 * item if group.size > 1 else 0
            counted(f"allreduce_sum {dtype}", moved, moved)
        group.reset_counters()
        group.allreduce_sum(torch.zeros(4))
        check("a group's seconds are its parent's too",
              group.seconds == comm.seconds > 0 and group.parent is comm)
        comm.reset_counters()
        try:
            group.allreduce_sum(torch.zeros((2, 2)).T)
            check("a non-contiguous buffer is refused", False)
        except ValueError as exc:
            check("a non-contiguous buffer is named", "contiguous" in str(exc))

    # objects and errors
    check("broadcast_object", comm.broadcast_object({"a": 1} if server else None) == {"a": 1})
    mine_object = comm.scatter_objects([f"to {r}" for r in range(size)] if server else None)
    check("scatter_objects", mine_object == f"to {rank}")
    errors = comm.agree_on_errors("bad shard" if rank == size - 1 else None)
    check("agree_on_errors", errors == [(size - 1, size - 2, "bad shard")])
    comm.reset_counters()
    counted("reset_counters", 0, 0)

    reports = comm.gather_objects({"rank": rank, "failures": failures})
    if server:
        with open(out, "w") as handle:
            json.dump({"size": size, "ranks": reports}, handle)


if __name__ == "__main__":
    main(sys.argv[1])
