"""mpifgl.watchdog without MPI: the timeout rule, and the monitors of a world of threads talking
over an in-process channel, one of them frozen (its monitor never runs)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mpifgl.config import parse_watchdog_seconds
from mpifgl.watchdog import (EPOCHS_OF_TIMEOUT, FLOOR_SECONDS, SETUP_SECONDS, Stall, Watchdog,
                             collective_name, timeout_seconds)

# a world that moves quickly: each wait may last TIMEOUT, a live monitor answers well within ANSWER
TIMEOUT, POLL, ANSWER = 0.05, 0.01, 0.3


def test_the_timeout_rule():
    assert timeout_seconds(None, None) == SETUP_SECONDS  # auto, in set-up
    assert timeout_seconds(None, 1.0) == FLOOR_SECONDS  # auto, fast epochs: the floor
    assert timeout_seconds(None, 60.0) == EPOCHS_OF_TIMEOUT * 60.0  # auto, slow epochs
    assert timeout_seconds(7.0, None) == timeout_seconds(7.0, 60.0) == 7.0  # as asked, always
    assert timeout_seconds(0.0, 60.0) == 0.0  # off
    assert parse_watchdog_seconds("auto") is None
    assert parse_watchdog_seconds("0") == 0.0 and parse_watchdog_seconds("2.5") == 2.5
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match=rf"--watchdog-seconds is '{bad}', expected auto, "
                                             r"0 \(off\) or a number of seconds > 0"):
            parse_watchdog_seconds(bad)


def test_collective_names():
    class Ireduce:  # what mpi4py's non-blocking calls are named
        pass
    assert collective_name(Ireduce) == "reduce"
    assert collective_name(list.copy) == "copy"
    assert collective_name("barrier") == "barrier"  # a name given as text


class ThreadWorld:
    """``size`` watchdogs in one process; ``frozen`` ranks never start their monitor. An abort
    stops every monitor, as MPI_Abort ends every process."""

    def __init__(self, size: int, frozen: set[int]):
        self.inboxes: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(size)]
        self.lock = threading.Lock()
        self.watchdogs = [Watchdog() for _ in range(size)]
        self.reports: list[tuple[int, Stall]] = []
        self.aborts: list[int] = []
        for rank, watchdog in enumerate(self.watchdogs):
            if rank not in frozen:
                watchdog.start(Channel(self, rank), lambda: TIMEOUT,
                               lambda stall, rank=rank: self.reports.append((rank, stall)),
                               poll_seconds=POLL, answer_seconds=ANSWER)

    def abort(self, rank: int) -> None:
        self.aborts.append(rank)
        for watchdog in self.watchdogs:
            watchdog._stop.set()

    def wait_for_abort(self, seconds: float) -> None:
        """Until an abort or ``seconds``; then every monitor is ended, so the reports are all."""
        deadline = time.monotonic() + seconds
        while not self.aborts and time.monotonic() < deadline:
            time.sleep(POLL)
        for watchdog in self.watchdogs:
            watchdog.stop()


class Channel:
    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank, self.size = world, rank, len(world.watchdogs)
        self.hosts = [f"node{r // 2}" for r in range(self.size)]

    def send(self, dest: int, message: np.ndarray) -> None:
        with self.world.lock:
            self.world.inboxes[dest].append((self.rank, np.array(message, dtype=np.float64)))

    def receive(self) -> list[tuple[int, np.ndarray]]:
        with self.world.lock:
            found, self.world.inboxes[self.rank][:] = list(self.world.inboxes[self.rank]), []
        return found

    def abort(self, code: int) -> None:
        self.world.abort(self.rank)


@pytest.mark.parametrize("frozen,reporter", [({2}, 0), ({0, 3}, 1)])
def test_ranks_that_do_not_answer_are_named_once_by_the_lowest_live_rank(frozen, reporter):
    world = ThreadWorld(4, frozen)
    for rank, watchdog in enumerate(world.watchdogs):
        if rank not in frozen:  # every live rank waits in a collective the frozen ones never join
            watchdog.wait = ("the world", "reduce")
    world.wait_for_abort(10 * (TIMEOUT + ANSWER))
    assert world.aborts == [reporter]
    assert len(world.reports) == 1
    rank, stall = world.reports[0]
    assert rank == reporter
    assert stall.silent == sorted(frozen)
    assert stall.hosts == [f"node{r // 2}" for r in sorted(frozen)]
    assert stall.waiting_in == "MPI reduce on the world" and stall.waited >= TIMEOUT


def test_a_busy_rank_answers_so_waiting_for_it_is_no_stall():
    """The server writes a checkpoint (busy, no collective) while every client waits for it
    far longer than the timeout: every rank answers, nobody reports."""
    world = ThreadWorld(3, frozen=set())
    for watchdog in world.watchdogs[1:]:
        watchdog.wait = ("the world", "gatherv")
    world.wait_for_abort(2 * ANSWER)  # the clients ask every TIMEOUT, a silent rank shows in ANSWER
    assert world.reports == [] and world.aborts == []


def test_a_wait_that_ends_while_the_ranks_are_asked_is_no_stall():
    """A rank that cannot answer in time (its answer is lost here) is not reported when the wait
    it was asked about ends meanwhile: the job moved on."""
    world = ThreadWorld(3, frozen={2})
    waiting = world.watchdogs[1]
    waiting.wait = ("the world", "bcast")
    time.sleep(TIMEOUT + 4 * POLL)  # the question is out, its answers are due in ANSWER
    waiting.wait = None
    world.wait_for_abort(ANSWER + 0.2)  # when that question's answers were due, and some
    assert world.reports == [] and world.aborts == []
