"""Timing lanes, parent side: one per GPU, at most one process timing on it at a time, and nothing else on it
meanwhile.

A candidate process compiles whenever the pool lets it run. Its timed phases hold its lane alone; its
correctness runs and the judges' checks (the other GPU work of a pool's evaluations) hold it shared with each
other, never beside a timed phase: a timed phase starts once the shared holds it found have ended (waiting at
most SHARED_WAIT_S for a judge's, MEMBER_WAIT_S for a candidate process's), and no shared hold starts while a
timed phase holds the lane or waits for it. Why: on the H200 at width 4 the other evaluations' kernels, sharing
the GPU by time slices, stretched a timed loop's calls and the harness's work between them by milliseconds, and
the referee (evaluation/referee_log.py) rejected honest candidates for it. While a process holds its lane alone,
the lane's other candidate processes are stopped (parking.py). A process asks for its lane through its gate
(gates.py).

Another engine (a cluster) supplies its own lanes: a Lane is any object with acquire, release and cancel, and
a device to pin its processes to.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Optional

from optagent.evaluation.parking import Parking

# How long a timed phase waits for a judge's shared hold it found (trusted work, never stopped) to end before it
# times beside it: longer than an evaluation's judging took on the H200 (1.5 s), short beside its timeout. A shared
# hold starts only after the timed phase (it waits whatever the time).
SHARED_WAIT_S = 5.0
# How long it waits for a candidate process's shared hold (its correctness phase) before it goes ahead and stops
# that process (parking.py): a checked run in flight has ended and synced by then (the harness syncs after each).
# Not SHARED_WAIT_S: the phase's hold spans its Triton compiles too, CPU work of up to tens of seconds (a strategy
# kernel specialised per case: 34 compiles), and at width 4 on an H100 the offline decode search's timed phases
# waited up to 5 s on each compiling neighbour, the GPU idle (lane waits of 9-17 s: docs/gpu.md, 2026-12-07, sixth
# session). A stopped process's checked run in flight still runs out on the GPU, as parking.py says.
MEMBER_WAIT_S = 0.5


@dataclass
class Hold:
    """One grant of a lane, for the cost split and for tests that check no two overlap."""
    who: Hashable
    granted: float
    released: Optional[float] = None


class Lane:
    """A FIFO lane: grants in the order asked. `device` pins the lane's processes (CUDA_VISIBLE_DEVICES)."""

    def __init__(self, index: int, device: Optional[str], holds: Optional[list[Hold]] = None):
        self.index, self.device = index, device
        self.name = f"lane {index}" + (f" (GPU {device})" if device is not None else "")
        self.holds: list[Hold] = [] if holds is None else holds
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._holder: Optional[Hold] = None
        self.shared_holds: list[Hold] = []  # each shared hold, as `holds` for the timed ones
        self._sharing: list[Hold] = []  # of those, the ones held now
        self._share_queue: list[Hashable] = []  # who waits for a shared hold (cancel takes them out)
        self.shared_wait_s, self.member_wait_s = SHARED_WAIT_S, MEMBER_WAIT_S
        # waits (at most OPTAGENT_SETTLE_S) until no process is starting up for this lane, so that none does beside
        # a timed phase; the seconds waited: set by a pool that starts processes ahead (warm_worker.Spares.settle)
        self.settle: Optional[Callable[[], float]] = None
        self.settled_s = 0.0  # how long its grants waited for start-ups, in all (bench/eval_cost.py)
        self.parking = Parking()  # its candidate processes, stopped while another holds it alone

    def _turn(self, who: Hashable) -> bool:
        return self._queue[0] == who

    def acquire(self, who: Hashable) -> bool:
        """Blocks until `who` holds the lane, and no process is starting for it (settle); False when `who` was
        cancelled meanwhile."""
        with self._cond:
            self._queue.append(who)
            while who in self._queue and (self._holder is not None or not self._turn(who)):
                self._cond.wait()
            if who not in self._queue:
                return False
            self._queue.remove(who)
            self._holder = hold = Hold(who, time.monotonic())
            self.holds.append(hold)
            # held: no shared hold starts now; those already running end first (bounded)
            while self._holder is hold and (left := self._wait_left(hold.granted)) > 0:
                self._cond.wait(left)
            if self._holder is hold:
                hold.granted = time.monotonic()
        if self.settle is not None:  # held: no one else times while the processes starting for it finish
            waited = self.settle()
            with self._cond:
                self.settled_s += waited
                if self._holder is hold:  # not released meanwhile (its process ended): its turn starts now
                    hold.granted = time.monotonic()
        with self._cond:
            if self._holder is hold:  # the lane's other candidate processes run nothing while it holds the lane
                self.parking.park(who)
        return True

    def _wait_left(self, since: float) -> float:
        """How much longer a timed phase granted at `since` waits for the shared holds held now (0: no more)."""
        now = time.monotonic()
        return max((since + (self.member_wait_s if self.parking.member(h.who) else self.shared_wait_s) - now
                    for h in self._sharing), default=0.0)

    def release(self, who: Hashable) -> None:
        with self._cond:
            if self._holder is not None and self._holder.who == who:
                self._holder.released = time.monotonic()
                self._holder = None
            self._done(who)
            self.parking.unpark(who)  # before the next holder, woken here, stops anyone
            self._cond.notify_all()

    def cancel(self, who: Hashable) -> None:
        """`who` will not time (any more): out of the queue; a hold it has is released."""
        with self._cond:
            self._queue = deque(w for w in self._queue if w != who)
        self.release(who)

    def acquire_shared(self, who: Hashable) -> bool:
        """Blocks while a timed phase holds the lane or waits for it; then `who` holds it beside any other shared
        hold. False when `who` was cancelled meanwhile (cancel_shared)."""
        with self._cond:
            self._share_queue.append(who)
            while who in self._share_queue and (self._holder is not None or self._queue):
                self._cond.wait()
            if who not in self._share_queue:
                return False
            self._share_queue.remove(who)
            self.shared_holds.append(hold := Hold(who, time.monotonic()))
            self._sharing.append(hold)
        return True

    def _end_shared(self, who: Hashable, every: bool) -> None:
        for hold in [h for h in self._sharing if h.who == who][: None if every else 1]:
            hold.released = time.monotonic()
            self._sharing.remove(hold)
        self._cond.notify_all()

    def release_shared(self, who: Hashable) -> None:
        with self._cond:
            self._end_shared(who, every=False)

    def cancel_shared(self, who: Hashable) -> None:
        """`who` will not hold the lane shared (any more): out of the wait; its shared holds are released."""
        with self._cond:
            self._share_queue[:] = [w for w in self._share_queue if w != who]
            self._end_shared(who, every=True)

    @contextlib.contextmanager
    def shared(self, who: Hashable) -> Iterator[None]:
        """The lane held shared for the body (a trusted process's GPU work in the parent's hands: a judge's)."""
        got = self.acquire_shared(who)
        try:
            yield
        finally:
            if got:
                self.release_shared(who)

    def _done(self, who: Hashable) -> None:  # a finished process's turn (OrderedLane)
        pass


class OrderedLane(Lane):
    """Grants in a fixed order (retime: back to back, in order), a finished process's turn passing."""

    def __init__(self, base: Lane, order: list[Hashable]):
        super().__init__(base.index, base.device, base.holds)
        self.settle = base.settle
        self.order, self.finished = list(order), set()

    def _turn(self, who: Hashable) -> bool:
        return next((w for w in self.order if w not in self.finished), None) == who

    def _done(self, who: Hashable) -> None:
        self.finished.add(who)
