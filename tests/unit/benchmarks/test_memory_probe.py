"""benchmarks/memory_probe.py: the watched thread's peak and the stack that reached it."""
from __future__ import annotations

import threading
import time

from benchmarks.memory_probe import Probe


def holds_memory() -> None:
    block = b"\x01" * (120 * 2 ** 20)  # written: resident
    time.sleep(0.3)  # the sampler runs while this line holds the block
    del block


def test_the_peak_names_the_line_that_held_the_memory(tmp_path):
    probe = Probe(str(tmp_path / "probe.txt"))
    probe.main = threading.get_ident()  # this thread is the one watched
    sampler = threading.Thread(target=probe.run, daemon=True)
    sampler.start()
    time.sleep(0.05)
    before = probe.peak
    holds_memory()
    probe.stopped.set()
    sampler.join(timeout=5)
    probe.write()
    text = (tmp_path / "probe.txt").read_text()
    peak = [line for line in text.splitlines() if line.startswith("PEAK")]
    assert len(peak) == 1 and float(peak[0].split()[1]) >= before + 100
    assert "test_memory_probe.py:12 holds_memory" in text and "heap" in peak[0]
