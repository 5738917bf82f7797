"""The watchdog: a job in which a rank stops answering ends with one line that names it.

A frozen rank (SIGSTOP, a node swapping or lost) holds every other rank in its next collective
forever, and a rank stuck in a collective cannot tell which peer is missing. So each rank runs a
monitor thread that needs nothing from its main thread:

* the main thread says which call that waits for other ranks it is in (``Watchdog.wait``, set
  around every such call in ``mpifgl.comm``): two attribute stores, no clock read in the hot
  loop;
* the monitor wakes every ``poll_seconds``, answers the questions other ranks sent it, and looks
  at its own main thread: once that has waited in one call longer than the timeout (timed from
  when the monitor first saw the call, so up to a poll late), it asks every other rank whether
  it is there (a channel of its own, ``SideChannel``; mpifgl.comm gives one over a copy of the
  world);
* every rank that answers within ``answer_seconds`` is alive, busy (an evaluation, a checkpoint
  on the server) or waiting too, and no reason to stop: the asking rank waits one more timeout.
  A rank that does not answer is frozen: the lowest rank that answered is told (it reports once
  for everyone) and prints one line naming the silent ranks, then aborts the job; if that rank
  has not ended the job ``answer_seconds`` later, the rank that found it reports itself.

No MPI here: the channel sends and receives small float64 arrays.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

# How long a rank may wait in one collective before it asks (--watchdog-seconds auto): through
# set-up (shards of a big graph take minutes to load, the default dataset is prepared first),
# then a floor, or a multiple of the longest epoch so far for slow runs
SETUP_SECONDS = 600.0
FLOOR_SECONDS = 120.0
EPOCHS_OF_TIMEOUT = 10
# A live rank's monitor answers within a poll interval; the margin covers a loaded machine and a
# main thread holding the GIL (serialising one large tensor)
POLL_SECONDS = 0.5
ANSWER_SECONDS = 10.0
TICK_SECONDS = 0.05  # how often the monitor looks while answers are due
WATCHDOG_EXIT_STATUS = 1

# message kinds (the first element of every message)
QUERY, ANSWER, VERDICT = 0.0, 1.0, 2.0


def timeout_seconds(requested: float | None, longest_epoch: float | None) -> float:
    """How long one collective may wait before the ranks are asked (0: never). ``requested``:
    --watchdog-seconds (None: auto); ``longest_epoch``: the longest epoch so far in seconds
    (None: still in set-up)."""
    if requested is not None:
        return requested
    if longest_epoch is None:
        return SETUP_SECONDS
    return max(FLOOR_SECONDS, EPOCHS_OF_TIMEOUT * longest_epoch)


class SideChannel(Protocol):
    """Point-to-point messages between the monitors of every rank, apart from the program's own
    traffic. ``send`` and ``receive`` never block; a frozen rank simply never answers."""

    rank: int
    size: int
    hosts: Sequence[str]  # each rank's host, learned at the start (a frozen rank says nothing)

    def send(self, dest: int, message: np.ndarray) -> None: ...

    def receive(self) -> list[tuple[int, np.ndarray]]:
        """Every message that has arrived, as (source rank, message)."""
        ...

    def abort(self, code: int) -> None:
        """End the whole job (after the report has reached the launcher)."""
        ...


def collective_name(call: object) -> str:
    """'reduce' for mpi4py's Ireduce, 'bcast' for its bcast, a name given as text unchanged."""
    if isinstance(call, str):
        return call
    name = getattr(call, "__name__", type(call).__name__)
    return (name[1:] if name[:1] == "I" else name).lower()  # Ireduce: a non-blocking reduce


class Watchdog:
    """One per process, shared by every communicator of the process (the world and the
    communicators split from it). Inert until ``start``."""

    def __init__(self) -> None:
        # The main thread's wait: (communicator name, the call or its name) while it is
        # in one, None while it works; a new tuple for each wait, so the monitor tells them apart
        self.wait: tuple[str, object] | None = None
        self.channel: SideChannel | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- the monitor ------------------------------------------------------------------------
    def start(self, channel: SideChannel, timeout: Callable[[], float],
              report: Callable[["Stall"], None], poll_seconds: float = POLL_SECONDS,
              answer_seconds: float = ANSWER_SECONDS) -> None:
        """Start the monitor thread. ``timeout()``: seconds one wait may last (0: off), asked
        anew each time; ``report(stall)``: prints the line (and releases what must be), then
        the job is aborted."""
        self.channel = channel
        self._timeout, self._report = timeout, report
        self._poll, self._answer_seconds = poll_seconds, answer_seconds
        self._thread = threading.Thread(target=self._monitor, name="mpifgl-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the monitor (before MPI is finalised)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _monitor(self) -> None:
        channel = self.channel
        everyone = set(range(channel.size)) - {channel.rank}
        asked = 0  # the number of this rank's last question (answers carry it)
        asked_at: float | None = None  # when it was sent; None: no question pending
        asked_about: tuple[str, object] | None = None  # the wait it was sent about
        answered: set[int] = set()
        # the main thread's wait as last seen, and since when (holding it keeps a new wait from
        # being the same object)
        seen: tuple[str, object] | None = None
        seen_at = 0.0
        next_question = 0.0
        verdict: tuple[float, list[int]] | None = None  # sent to the lowest live rank
        verdict_at = 0.0
        while not self._stop.wait(self._poll if asked_at is None and verdict is None
                                  else TICK_SECONDS):
            now = time.perf_counter()
            for source, message in channel.receive():
                if message[0] == QUERY:
                    channel.send(source, np.asarray([ANSWER, message[1]]))
                elif message[0] == ANSWER and message[1] == asked:
                    answered.add(source)
                elif message[0] == VERDICT:  # this rank is the lowest live one: it reports
                    return self._end(float(message[1]), [int(r) for r in message[2:]])
            wait = self.wait
            if wait is not seen:
                seen, seen_at = wait, now
            if verdict is not None:
                if now - verdict_at > self._answer_seconds:  # the lowest live rank is silent too
                    return self._end(*verdict)
            elif asked_at is None:
                timeout = self._timeout()
                if wait is not None and timeout and now - seen_at >= timeout \
                        and now >= next_question:
                    asked, asked_at, asked_about, answered = asked + 1, now, wait, set()
                    for rank in sorted(everyone):
                        channel.send(rank, np.asarray([QUERY, asked]))
            elif wait is not asked_about:  # the wait ended meanwhile: the job moves
                asked_at = None
            elif answered == everyone:  # every rank is there, busy or waiting too
                asked_at, next_question = None, now + self._timeout()
            elif now - asked_at >= self._answer_seconds:
                missing = sorted(everyone - answered)
                reporter = min(answered | {channel.rank})
                if reporter == channel.rank:
                    return self._end(now - seen_at, missing)
                verdict, verdict_at = (now - seen_at, missing), now
                channel.send(reporter, np.asarray([VERDICT, now - seen_at, *missing]))

    def _end(self, waited: float, missing: list[int]) -> None:
        """Report the stall (``report`` prints the line), then abort the job."""
        wait = self.wait
        waiting_in = f"MPI {collective_name(wait[1])} on {wait[0]}" if wait is not None else None
        try:
            self._report(Stall(waited, missing, [self.channel.hosts[r] for r in missing],
                               waiting_in, self._answer_seconds))
        finally:
            self.channel.abort(WATCHDOG_EXIT_STATUS)


@dataclass(frozen=True)
class Stall:
    """What the watchdog found: the job waited ``waited`` seconds for ``silent`` ranks (on
    ``hosts``), which did not answer within ``answer_seconds``; ``waiting_in``: the call the
    reporting rank waits in (None: it is busy)."""

    waited: float
    silent: list[int]
    hosts: list[str]
    waiting_in: str | None
    answer_seconds: float
