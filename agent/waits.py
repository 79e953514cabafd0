"""Waits in the main thread that Ctrl-C can interrupt.

The kernel gives a process-directed SIGINT to any thread that does not block it, and Python
runs its handler only in the main thread, once that thread runs bytecode again. A main
thread blocked with no timeout (on a future, a thread pool's shutdown) while the signal
landed on one of the pool's threads stays blocked until the wait ends: the whole
evaluation, or a reasoning model's minutes. Waiting in short slices lets the handler run.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Iterable, Optional, TypeVar

T = TypeVar("T")
SLICE_S = 0.25

# The same slices end a run at its --time-limit with evaluations in flight: once the deadline
# (time.monotonic()) has passed, a wait raises DeadlineReached in the main thread, and the caller
# unwinds as for Ctrl-C (the pool stops its workers; the loop records the cut-off evaluations as
# unfinished, so a resume evaluates them again). None: no deadline.
_deadline: Optional[float] = None


class DeadlineReached(Exception):
    """The run's deadline passed while the main thread waited."""


def set_deadline(at: Optional[float]) -> None:
    global _deadline
    _deadline = at


def _check() -> None:
    if _deadline is not None and time.monotonic() >= _deadline:
        raise DeadlineReached("the run's time limit passed during a wait")


def first_done(pending: set[Future]) -> tuple[set[Future], set[Future]]:
    """concurrent.futures.wait(pending, return_when=FIRST_COMPLETED), in slices."""
    while True:
        done, rest = wait(pending, timeout=SLICE_S, return_when=FIRST_COMPLETED)
        if done or not rest:
            return done, rest
        _check()


def all_done(futures: Iterable[Future]) -> None:
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=SLICE_S)
        if pending:
            _check()


def result(future: "Future[T]") -> T:
    while True:
        try:
            return future.result(timeout=SLICE_S)
        except FutureTimeout:
            _check()
