"""Timing lanes, parent side: one per GPU, at most one process timing on it at a time, and nothing else on it
meanwhile.

A candidate process compiles whenever the pool lets it run. Its timed phases hold its lane alone; its
correctness runs and the judges' checks (the other GPU work of a pool's evaluations) hold it shared with each
other, never beside a timed phase: a timed phase starts once the shared holds it found have ended (waiting at
most SHARED_WAIT_S), and no shared hold starts while a timed phase holds the lane or waits for it. Why: on the
H200 at width 4 the other evaluations' kernels, sharing the GPU by time slices, stretched a timed loop's calls
and the harness's work between them by milliseconds, and the referee (evaluation/referee_log.py) rejected
honest candidates for it. The child asks with LaneWanted on its result channel and blocks reading its gate (a
pipe passed to it, worker/lane.py); the parent writes one byte when the lane is free and takes it back on
LaneReleased (a timed phase: only once the process has ended, HELD_TO_THE_END), or when the process ends (exit,
kill, timeout): a process that never releases holds only its own evaluation, whose timeout ends it. The time
spent waiting is not counted against the process's timeout.

Another engine (a cluster) supplies its own lanes: a Lane is any object with acquire, release and cancel, and
a device to pin its processes to.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Optional

from optagent.messages import LaneReleased, LaneWanted, Message, Phase
from optagent.settings import LANE_FD_ENV

# How long a timed phase waits for the shared holds it found (a judge's check, another candidate's correctness
# runs) to end before it times beside them: longer than an evaluation's judging took on the H200 (1.5 s), short
# beside its timeout. A shared hold starts only after the timed phase (it waits whatever the time).
SHARED_WAIT_S = 5.0
SHARED_PHASES = (Phase.CASE,)  # a worker's phases that hold their lane shared; the others hold it alone
# Phases held until the process has ended, whatever it says: the timed phase is its last, and candidate code that
# runs on after it (a finaliser, a patched harness function, a kernel left on a stream) must not run beside the
# next timed phase. Not the baseline phase (job.time_baseline): it comes before any candidate code.
HELD_TO_THE_END = (Phase.TIMING,)
# How long it may take to end after such a phase (its Done, its exit, a GPU context's teardown: 0.12 s on the H200)
# before it is stopped there, its lane given back and its verdict a failure: the lane it holds is the pool's.
ENDING_GRACE_S = 10.0


class Stopped(Exception):
    """The pool was stopped (Ctrl-C, or its caller gave up on the round): the worker is killed."""


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
        self.shared_wait_s = SHARED_WAIT_S
        # waits (at most OPTAGENT_SETTLE_S) until no process is starting up for this lane, so that none does beside
        # a timed phase; the seconds waited: set by a pool that starts processes ahead (warm_worker.Spares.settle)
        self.settle: Optional[Callable[[], float]] = None
        self.settled_s = 0.0  # how long its grants waited for start-ups, in all (bench/eval_cost.py)

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
            deadline = hold.granted + self.shared_wait_s
            while self._sharing and self._holder is hold and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if self._holder is hold:
                hold.granted = time.monotonic()
        if self.settle is not None:  # held: no one else times while the processes starting for it finish
            waited = self.settle()
            with self._cond:
                self.settled_s += waited
                if self._holder is hold:  # not released meanwhile (its process ended): its turn starts now
                    hold.granted = time.monotonic()
        return True

    def release(self, who: Hashable) -> None:
        with self._cond:
            if self._holder is not None and self._holder.who == who:
                self._holder.released = time.monotonic()
                self._holder = None
            self._done(who)
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


class Control:
    """What a pool adds to one worker process: its device, a stop flag (and a gate, in Gate)."""

    def __init__(self, device: Optional[str] = None, stop: Optional[threading.Event] = None):
        self.device = device  # the lane's GPU (None: whatever the process sees)
        self.env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": device} if device is not None else {}
        self.fds: tuple[int, ...] = ()
        self.stop = stop

    def spawned(self) -> None: ...

    def on_message(self, msg: Message) -> None: ...

    def waited_s(self) -> float:
        return 0.0

    def waited_in(self, phase: Phase) -> float:
        """Of waited_s, the waits for `phase`'s holds (the cost split's timing excludes its own)."""
        return 0.0

    def shared_hold(self, who: Hashable) -> contextlib.AbstractContextManager:
        """The lane held shared by trusted work of this evaluation's (its judges), where it has a lane."""
        return contextlib.nullcontext()

    def limit(self) -> Optional[str]:
        """Why the process must be stopped now, for its lane's sake (the sandbox stops it as at any limit), or None."""
        return None

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def close(self) -> None: ...


class Gate(Control):
    """The lane gate of one candidate process: granted on LaneWanted (shared for SHARED_PHASES, else alone),
    taken back on LaneReleased or close() (a phase of HELD_TO_THE_END: on close() only)."""

    def __init__(self, lane: Lane, who: Hashable, stop: Optional[threading.Event] = None):
        super().__init__(lane.device, stop)
        self.lane, self.who = lane, who
        self._r, self._w = os.pipe()
        self.fds = (self._r,)
        self.env[LANE_FD_ENV] = str(self._r)
        self._lock = threading.Lock()
        self._asked: Optional[float] = None  # waiting since
        self._phase: Optional[Phase] = None  # of the hold asked for or held
        self._held = self._closed = False
        self._over: Optional[float] = None  # when a HELD_TO_THE_END phase said it was over: the process should end
        self.waited: dict[Phase, float] = {}

    def spawned(self) -> None:
        os.close(self._r)  # the child has its copy

    def _shared(self) -> bool:
        return self._phase in SHARED_PHASES

    def on_message(self, msg: Message) -> None:
        with self._lock:
            if isinstance(msg, LaneWanted) and self._asked is None and not self._held and not self._closed:
                self._asked, self._phase = time.monotonic(), msg.phase
                threading.Thread(target=self._grant, name="optagent-lane", daemon=True).start()
            elif isinstance(msg, LaneReleased) and self._held and msg.phase is self._phase:
                if msg.phase in HELD_TO_THE_END:
                    self._over = time.monotonic()  # held on until the process has ended (close)
                else:
                    self._give_back()
            # anything else (a second ask, a release not held) is a forgery the verdict rejects (verdict.ONCE)

    def _grant(self) -> None:
        shared = self._shared()
        got = (self.lane.acquire_shared if shared else self.lane.acquire)(self.who)
        with self._lock:
            if self._asked is not None and self._phase is not None:
                self.waited[self._phase] = self.waited.get(self._phase, 0.0) + time.monotonic() - self._asked
                self._asked = None
            if not got:
                return
            if self._closed:
                (self.lane.release_shared if shared else self.lane.release)(self.who)
                return
            self._held = True
            try:
                os.write(self._w, b"\x01")
            except OSError:  # the child is gone; close() follows
                pass

    def _give_back(self) -> None:
        self._held = False
        (self.lane.release_shared if self._shared() else self.lane.release)(self.who)

    def waited_s(self) -> float:
        with self._lock:
            return sum(self.waited.values()) + (time.monotonic() - self._asked if self._asked is not None else 0.0)

    def waited_in(self, phase: Phase) -> float:
        with self._lock:
            return self.waited.get(phase, 0.0)

    def shared_hold(self, who: Hashable) -> contextlib.AbstractContextManager:
        return self.lane.shared((self.who, who))

    def limit(self) -> Optional[str]:
        with self._lock:
            over = self._over if self._held else None
        late = over is not None and time.monotonic() - over > ENDING_GRACE_S
        return f"the candidate process did not end within {ENDING_GRACE_S:g} s of its timed phase" if late else None

    def close(self) -> None:
        """The process has ended: its lane is free again, whatever it said."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._held:
                self._give_back()
            elif self._shared():
                self.lane.cancel_shared(self.who)
            else:
                self.lane.cancel(self.who)
            os.close(self._w)
