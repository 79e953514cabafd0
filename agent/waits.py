"""Waits in the main thread that Ctrl-C can interrupt.

The kernel gives a process-directed SIGINT to any thread that does not block it, and Python
runs its handler only in the main thread, once that thread runs bytecode again. A main
thread blocked with no timeout (on a future, a thread pool's shutdown) while the signal
landed on one of the pool's threads stays blocked until the wait ends: the whole
evaluation, or a reasoning model's minutes. Waiting in short slices lets the handler run.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Iterable, TypeVar

T = TypeVar("T")
SLICE_S = 0.25


def first_done(pending: set[Future]) -> tuple[set[Future], set[Future]]:
    """concurrent.futures.wait(pending, return_when=FIRST_COMPLETED), in slices."""
    while True:
        done, rest = wait(pending, timeout=SLICE_S, return_when=FIRST_COMPLETED)
        if done or not rest:
            return done, rest


def all_done(futures: Iterable[Future]) -> None:
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=SLICE_S)


def result(future: "Future[T]") -> T:
    while True:
        try:
            return future.result(timeout=SLICE_S)
        except FutureTimeout:
            continue
