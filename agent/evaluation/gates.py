"""A worker process's side of its timing lane, in the parent: what a pool adds to each process (Control), and
a candidate process's gate to its lane (Gate).

The child asks with LaneWanted on its result channel and blocks reading its gate (a pipe passed to it,
worker/lane.py); the parent writes one byte when the lane is free (evaluation/lanes.py) and takes it back on
LaneReleased (a timed phase: only once the process has ended, HELD_TO_THE_END), or when the process ends (exit,
kill, timeout): a process that never releases holds only its own evaluation, whose timeout ends it. Once the
process has compiled its candidate it is one of its lane's members, stopped while another process holds the lane
alone (evaluation/parking.py). The time spent waiting or stopped is not counted against the process's timeout.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Hashable, Optional

from optagent.evaluation.lanes import Lane
from optagent.evaluation.parking import Processes
from optagent.messages import Compiled, LaneReleased, LaneWanted, Message, Phase
from optagent.settings import LANE_FD_ENV

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


class Control:
    """What a pool adds to one worker process: its device, a stop flag (and a gate, in Gate)."""

    def __init__(self, device: Optional[str] = None, stop: Optional[threading.Event] = None):
        self.device = device  # the lane's GPU (None: whatever the process sees)
        self.env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": device} if device is not None else {}
        self.fds: tuple[int, ...] = ()
        self.stop = stop

    def spawned(self, pid: Optional[int] = None, marker: str = "") -> None:
        """The worker has started (pid: its process; None: it could not) or has its job (a warm one)."""

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
        self._procs: Optional[Processes] = None
        # Stopped while another process holds the lane alone (parking.py), counted as a wait for the checking phase's
        # hold, except while it waits for a hold anyway. A leaf lock: the lane's parking pauses it under its own.
        self._stop_lock = threading.Lock()
        self._paused = False
        self._stopped: Optional[float] = None  # counted since
        self._stopped_s = 0.0

    def spawned(self, pid: Optional[int] = None, marker: str = "") -> None:
        os.close(self._r)  # the child has its copy
        self._procs = Processes(pid, marker) if pid is not None else None

    def pause(self) -> None:  # (not stop: Control.stop is the pool's stop flag)
        if self._procs is not None:
            self._procs.stop()
            self._count_stopped(self._asked is None, paused=True)

    def resume(self) -> None:
        if self._procs is not None:
            self._procs.cont()
            self._count_stopped(False, paused=False)

    def _count_stopped(self, counting: bool, paused: Optional[bool] = None) -> None:
        """Stopped time counted from now on (counting, while paused) or no longer (it waits for a hold, or runs
        again); `paused` set in the same step, so that a grant between the two never starts a count that lasts."""
        with self._stop_lock:
            self._paused = self._paused if paused is None else paused
            now = time.monotonic()
            self._stopped_s += now - self._stopped if self._stopped is not None else 0.0
            self._stopped = now if counting and self._paused else None

    def _stopped_now(self) -> float:
        with self._stop_lock:
            return self._stopped_s + (time.monotonic() - self._stopped if self._stopped is not None else 0.0)

    def _shared(self) -> bool:
        return self._phase in SHARED_PHASES

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, Compiled) and not self._closed:  # candidate code may run from now on
            self.lane.parking.enter(self.who, self)
        with self._lock:
            if isinstance(msg, LaneWanted) and self._asked is None and not self._held and not self._closed:
                self._asked, self._phase = time.monotonic(), msg.phase
                self._count_stopped(False)
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
                self._count_stopped(True)
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
            waited = sum(self.waited.values()) + (time.monotonic() - self._asked if self._asked is not None else 0.0)
        return waited + self._stopped_now()

    def waited_in(self, phase: Phase) -> float:
        with self._lock:
            waited = self.waited.get(phase, 0.0)
        return waited + (self._stopped_now() if phase is Phase.CASE else 0.0)

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
            self.lane.parking.leave(self.who)
            if self._held:
                self._give_back()
            elif self._shared():
                self.lane.cancel_shared(self.who)
            else:
                self.lane.cancel(self.who)
            os.close(self._w)
