"""Worker side of the timing lane: the timed phases wait for the parent's go-ahead.

The parent (evaluation/gates.py) may pass a gate: the read end of a pipe whose number is in
LANE_FD_ENV. Before a timed phase the harness says LaneWanted on its result channel and blocks
reading one byte from the gate, which the parent writes when no other process times on this
lane's device; after the phase it says LaneReleased. Where the job says so (Job.shared_checks: on a
GPU) its correctness runs ask the same way for a shared hold (Phase.CASE), granted beside other
shared holds and never beside a timed phase. Without a gate the messages only mark the phase (its
cost). The gate's number is read at import, before any candidate code runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

from optagent.messages import Channel, LaneReleased, LaneWanted, Phase
from optagent.settings import LANE_FD_ENV

STARTED = time.monotonic()  # the worker's harness is running (worker/__main__.py imports this first)


def _gate_fd() -> Optional[int]:
    raw = os.environ.pop(LANE_FD_ENV, "")
    return int(raw) if raw.isdigit() else None


_GATE = _gate_fd()


def job_arrived(gate_fd: Optional[int]) -> None:
    """A warm worker's job has come (worker/__main__.py): its gate came with it, and its start counts from
    now (the imports were paid while it waited: evaluation/warm_worker.py)."""
    global _GATE, STARTED
    STARTED = time.monotonic()
    if gate_fd is not None:
        _GATE = gate_fd


@contextlib.contextmanager
def lane(chan: Channel, phase: Phase) -> Iterator[None]:
    """Holds the timing lane (where there is one) for the body; the parent releases it too when
    this process ends, so a phase that raises or dies frees the lane."""
    chan.send(LaneWanted(phase=phase))
    if _GATE is not None:
        if not os.read(_GATE, 1):  # (a signal in between is retried by os.read itself)
            raise RuntimeError("the timing lane's gate closed before the lane was granted")
    try:
        yield
    finally:
        chan.send(LaneReleased(phase=phase))
