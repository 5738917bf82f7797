"""The CPU sparse kernels of ``mpifgl.operators``: scipy's CSR loop against torch's CSR product
(MKL's where torch has it), on random graphs of several sizes, the evidence behind
``TORCH_KERNEL_MIN_ENTRIES``.

    . .venv/bin/activate
    python benchmarks/bench_kernels.py [--repeats 5] [--threads 1,2]

For each size: the best of ``--repeats`` products (after one untimed call) of a random CSR
matrix (``degree`` entries per row at random columns) with a dense float32 matrix of ``width``
columns, by scipy's kernel (one thread) and by torch's with each thread count of
``--threads``, scipy's time over torch's, the largest difference from scipy's result relative
to its largest value, and whether torch's bits are the same on every thread count. Run it on an
otherwise idle machine. Asserts nothing.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
import torch

from mpifgl import operators

# (rows = columns, entries per row, dense width): from below the threshold to a products client
SIZES = [(1_000, 5, 16), (2_000, 10, 128), (3_000, 5, 64), (20_000, 10, 128), (14_000, 36, 128),
         (50_000, 20, 128), (100_000, 10, 47), (300_000, 3, 128), (300_000, 25, 100),
         (300_000, 25, 128)]


def best_seconds(work, repeats: int) -> float:
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed products per kernel")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    args = parser.parse_args(argv)
    thread_counts = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    print("rows, entries, width: scipy ms | torch ms (threads) | scipy / torch (1st count) | "
          "relative difference | same bits on every count", flush=True)
    for rows, degree, width in SIZES:
        row_of = np.repeat(np.arange(rows), degree)
        matrix = sp.csr_matrix((rng.random(rows * degree, dtype=np.float32),
                                (row_of, rng.integers(0, rows, rows * degree))), shape=(rows, rows))
        arrays = operators.CSRArrays.of(matrix)
        dense = rng.standard_normal((rows, width), dtype=np.float32)
        def with_scipy():
            return operators.scipy_csr_product(arrays.indptr, arrays.indices, arrays.data,
                                               arrays.shape, dense)

        scipy_s, scipy_result = best_seconds(with_scipy, args.repeats), with_scipy()
        torch_s, results = [], []
        for count in thread_counts:
            torch.set_num_threads(count)

            def with_torch():
                return operators.torch_csr_product(arrays.indptr, arrays.indices, arrays.data,
                                                   arrays.shape, dense)

            torch_s.append(best_seconds(with_torch, args.repeats))
            results.append(with_torch())
        difference = (np.abs(results[0].numpy() - scipy_result).max()
                      / max(np.abs(scipy_result).max(), 1e-30))
        same = all(torch.equal(results[0], other) for other in results[1:])
        times = ", ".join(f"{s * 1e3:.2f} ({c})" for s, c in zip(torch_s, thread_counts))
        print(f"{rows:,}, {arrays.nnz:,}, {width}: {scipy_s * 1e3:.2f} | {times} | "
              f"{scipy_s / torch_s[0]:.2f}x | {difference:.1e} | {'yes' if same else 'NO'}",
              flush=True)


if __name__ == "__main__":
    main()
