"""Plain progress display on stderr for long offline steps (no dependency, no colours).

On a terminal a counter is redrawn in place; in a log file one line is written at most every
``log_interval`` seconds plus a final line, so logs stay short."""
from __future__ import annotations

import contextlib
import resource
import sys
import time
from typing import IO, Iterator


def peak_rss_mb() -> float:
    """Peak resident set size of this process and of its waited-for children, in MB (Linux KB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


class Counter:
    """``update(k)`` advances a named count towards ``total`` and redraws when due."""

    def __init__(self, owner: "Progress", label: str, total: int):
        self.owner, self.label, self.total = owner, label, max(0, int(total))
        self.done = 0
        self.start = time.perf_counter()
        self.last_draw = self.start
        self.drawn_done = -1  # count shown by the last line, to avoid repeating the final one

    def update(self, amount: int = 1) -> None:
        self.done += amount
        now = time.perf_counter()
        interval = 0.2 if self.owner.is_tty else self.owner.log_interval
        if now - self.last_draw >= interval:
            self.last_draw = now
            self.drawn_done = self.done
            self.owner._draw(self._text(now), final=False)

    def _text(self, now: float) -> str:
        percent = 100.0 * self.done / self.total if self.total else 100.0
        return (f"{self.label}: {self.done}/{self.total} ({percent:.0f}%) "
                f"{now - self.start:.1f} s")

    def close(self) -> None:
        if self.owner.is_tty or self.drawn_done != self.done:
            self.owner._draw(self._text(time.perf_counter()), final=True)


class Progress:
    """Progress reporter; ``Progress(enabled=False)`` is silent."""

    def __init__(self, enabled: bool = True, stream: IO[str] | None = None,
                 log_interval: float = 5.0):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.log_interval = log_interval
        self.is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._open_line = False

    def _draw(self, text: str, final: bool) -> None:
        if not self.enabled:
            return
        if self.is_tty:
            self.stream.write("\r\033[K" + "data_prep: " + text + ("\n" if final else ""))
            self._open_line = not final
        else:
            self.stream.write("data_prep: " + text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            if self._open_line:
                self.stream.write("\n")
                self._open_line = False
            self.stream.write("data_prep: " + text + "\n")
            self.stream.flush()

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Announce a step and report its duration when it ends (not when it fails)."""
        self.message(f"{label} ...")
        start = time.perf_counter()
        yield
        self.message(f"{label}: done in {time.perf_counter() - start:.1f} s "
                     f"(peak RSS {peak_rss_mb():.0f} MB)")

    @contextlib.contextmanager
    def counter(self, label: str, total: int) -> Iterator[Counter]:
        count = Counter(self, label, total)
        yield count
        count.close()
