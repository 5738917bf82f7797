"""Where one rank's memory peaks: runs a module as ``python -m`` would, and on one rank samples its
resident memory every 2 ms; at each new high (every 50 MB, and the last) it records the main
thread's Python stack and glibc's heap figures (``mallinfo2``: heap, in use, free, mapped
blocks). Printed when the program ends, to --out.

    . .venv/bin/activate
    mpirun -n 9 python benchmarks/memory_probe.py --rank 1 --out probe.txt \\
        -m mpifgl.train --shards SHARDS --out RUN --force --epochs 2 --eval-every 2

``--rank``: the MPI rank to watch (OMPI_COMM_WORLD_RANK or PMI_RANK; 0 outside mpirun). The
sampling thread needs the GIL, so a high reached inside one long call is seen when it returns
or releases it (numpy and torch release it in their kernels). The probe imports mpifgl (and so torch) before
the module runs, as the programs it watches do. Asserts nothing; docs/hardware.md
("Where a rank's memory goes") reads such a profile.
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mpifgl.hardware import glibc  # noqa: E402  (the repository root first)

PROCESS = psutil.Process()

STEP_MB = 50  # a new high this far above the last recorded one is recorded too
PERIOD_S = 0.002


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap_line() -> str:
    """glibc's heap figures now, or why there are none."""
    libc = glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):  # not glibc, or older than 2.33
        return "no mallinfo2"
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    mb = 2 ** 20
    return (f"heap {info.arena / mb:.0f} MB (in use {info.uordblks / mb:.0f}, free "
            f"{info.fordblks / mb:.0f}), mapped blocks {info.hblkhd / mb:.0f} MB in {info.hblks}")


def _resident_mb() -> float:
    return PROCESS.memory_info().rss / 2 ** 20


class Probe:
    def __init__(self, out: str):
        self.out = out
        self.main = threading.main_thread().ident
        self.peak, self.recorded = 0.0, 0.0
        self.highs: list[tuple[float, float, str, list[str]]] = []
        self.top: tuple[float, float, str, list[str]] | None = None
        self.start = time.time()
        self.stopped = threading.Event()

    def snapshot(self, resident: float) -> tuple[float, float, str, list[str]]:
        frame = sys._current_frames().get(self.main)
        stack = traceback.extract_stack(frame)[-14:] if frame is not None else []
        return (time.time() - self.start, resident, _heap_line(),
                [f"{os.path.basename(s.filename)}:{s.lineno} {s.name}" for s in stack])

    def run(self) -> None:
        while not self.stopped.is_set():
            resident = _resident_mb()
            if resident > self.peak:
                self.peak = resident
                self.top = self.snapshot(resident)
                if resident > self.recorded + STEP_MB:
                    self.recorded = resident
                    self.highs.append(self.top)
            time.sleep(PERIOD_S)

    def write(self) -> None:
        with open(self.out, "w") as out:
            for label, (at, resident, heap, stack) in [("high", h) for h in self.highs] + (
                    [("PEAK", self.top)] if self.top else []):
                out.write(f"{label} {resident:.0f} MB at {at:.1f} s; {heap}\n    ")
                out.write("\n    ".join(stack) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--rank R] [--out FILE] -m MODULE ARGS...")
    parser.add_argument("--rank", type=int, default=1, help="the MPI rank to watch")
    parser.add_argument("--out", default="memory_probe.txt", help="the profile's file")
    # everything from -m on is the module's own command line (it may have an --out of its own)
    cut = sys.argv.index("-m") if "-m" in sys.argv else len(sys.argv)
    args = parser.parse_args(sys.argv[1:cut])
    if cut + 1 >= len(sys.argv):
        parser.error("-m MODULE is required")
    args.module, rest = sys.argv[cut + 1], sys.argv[cut + 2:]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    if rank == args.rank:
        probe = Probe(args.out)
        threading.Thread(target=probe.run, daemon=True).start()
        atexit.register(probe.write)
    sys.argv = [args.module] + rest
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
