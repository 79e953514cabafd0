"""Verdicts an evaluation's surroundings can cause, not its kernel: such an evaluation runs once more with no other
evaluation of its pool beside it (evaluation/pool.py), and that verdict stands.

- ``crowded``: on a GPU, the evaluations beside it share the device's memory and the host's cores (below);
- ``killed_from_outside``: its candidate process was ended by a signal no limit, timeout or stop of the parent's
  sent and no fault of its own raises (sandbox.WorkerRun): the host's OOM killer under its neighbours' memory, an
  operator. A kernel that kills itself so gains one more evaluation, which ends the same way.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from optagent.evaluation.gates import Stopped
from optagent.evaluation.referee_log import NOT_THE_HARNESS
from optagent.evaluation.timer_check import MOVED
from optagent.schema import Device, EvalResult, Status

ALONE_TOO = "alone too"  # said of a verdict that came again when it ran alone


def again_alone(result: EvalResult, jobs: int) -> bool:
    """Whether the evaluation runs once more alone: killed from outside, or crowded where others ran beside it."""
    return result.killed_from_outside or (jobs > 1 and crowded(result))


def crowded(result: EvalResult) -> bool:
    """A GPU verdict that other evaluations beside it can cause: the device's memory ran out, the harness's
    work between timed calls ran slower than the lane's baseline job measured it on an idle host (on the
    H200, 891 us against 276 with sixteen busy processes on sixteen cores), or the referee's clock saw the
    calls take far longer than the timer's records say (a busy host stretches the referee's windows, which
    the timer's host-speed probe leaves out of its claim). A kernel that moves work there, or forges its
    records, does so alone too: the checks do not rest on chance, so running it again gives a cheat nothing."""
    reason = result.reason or ""
    if result.device is not Device.CUDA:
        return False
    if result.status is Status.RUNTIME_ERROR:
        return any(m in reason for m in ("CUDA out of memory", "OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY"))
    return result.status is Status.REJECTED and reason.endswith((MOVED, NOT_THE_HARNESS))


class Crowd:
    """The pool's evaluations in flight; alone() waits until no other runs and lets none start meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._wanted = 0  # members waiting to run alone: no new member starts meanwhile
        self._exclusive = False

    @contextmanager
    def member(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._wanted:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextmanager
    def alone(self, stop: threading.Event) -> Iterator[None]:
        """Called by a member: it steps out while it waits, so two that ask at once take turns."""
        with self._cond:
            self._running -= 1
            self._wanted += 1
            self._cond.notify_all()
            while self._exclusive or self._running > 0:
                if stop.is_set():
                    self._running += 1
                    self._wanted -= 1
                    self._cond.notify_all()
                    raise Stopped("the evaluation was stopped while it waited to run alone")
                self._cond.wait(0.5)
            self._wanted -= 1
            self._exclusive = True
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
