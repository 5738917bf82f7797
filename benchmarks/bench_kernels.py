"""The CPU sparse kernels of ``mpifgl.operators`` on one thread: scipy's CSR loop against the
numba loop, on random graphs of several sizes, the evidence behind
``ONE_THREAD_KERNEL_MIN_ENTRIES``.

    . .venv/bin/activate
    python benchmarks/bench_kernels.py [--repeats 5]

For each size: the best of ``--repeats`` products (after one untimed call) of a random CSR
matrix (``degree`` entries per row at random columns) with a dense float32 matrix of ``width``
columns, by scipy's kernel and by the numba loop with one thread, their ratio, and whether the
two results are equal bit for bit. Run it on an otherwise idle machine. Asserts nothing.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from mpifgl import operators

# (rows = columns, entries per row, dense width): amazon-computers-like up to a products client
SIZES = [(3_000, 5, 64), (20_000, 10, 128), (14_000, 36, 128), (50_000, 20, 128),
         (100_000, 10, 47), (300_000, 3, 128), (300_000, 25, 100), (300_000, 25, 128)]


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
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    loop, numba = operators._parallel_loop()
    numba.set_num_threads(1)
    operators.set_cpu_threads(1)
    operators._WARM_SIGNATURES.clear()  # nothing loaded: csr_matmul_host keeps scipy's kernel
    print("rows, entries, width: scipy ms, numba (1 thread) ms, scipy / numba, equal", flush=True)
    for rows, degree, width in SIZES:
        row_of = np.repeat(np.arange(rows), degree)
        matrix = sp.csr_matrix((rng.random(rows * degree, dtype=np.float32),
                                (row_of, rng.integers(0, rows, rows * degree))), shape=(rows, rows))
        arrays = operators.CSRArrays.of(matrix)
        dense = rng.standard_normal((rows, width), dtype=np.float32)

        def with_scipy():
            return operators.csr_matmul_host(arrays.indptr, arrays.indices, arrays.data,
                                             arrays.shape, dense)

        def with_numba():
            out = np.zeros((rows, width), np.float32)
            loop(arrays.indptr, arrays.indices, arrays.data, dense, out)
            return out

        scipy_s = best_seconds(with_scipy, args.repeats)
        numba_s = best_seconds(with_numba, args.repeats)
        equal = np.array_equal(with_scipy(), with_numba())
        print(f"{rows:,}, {arrays.nnz:,}, {width}: {scipy_s * 1e3:.1f} ms, {numba_s * 1e3:.1f} ms, "
              f"{scipy_s / numba_s:.2f}x, {'equal' if equal else 'DIFFERENT'}", flush=True)


if __name__ == "__main__":
    main()
