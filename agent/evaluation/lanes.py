"""Timing lanes, parent side: one per GPU, at most one process timing on it at a time.

A candidate process compiles and checks its kernel whenever the pool lets it run; only its
timed phases wait for its lane. The child asks with LaneWanted on its result channel and
blocks reading its gate (a pipe passed to it, worker/lane.py); the parent writes one byte
when the lane is free and takes it back on LaneReleased, or when the process ends (exit,
kill, timeout): a process that never releases holds only its own evaluation, whose timeout
ends it. The time spent waiting is not counted against the process's timeout.

Another engine (a cluster) supplies its own lanes: a Lane is any object with acquire,
release and cancel, and a device to pin its processes to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Optional

from optagent.messages import LaneReleased, LaneWanted, Message
from optagent.settings import LANE_FD_ENV


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
            if who in self._queue:
                self._queue.remove(who)
        self.release(who)

    def _done(self, who: Hashable) -> None:
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

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def close(self) -> None: ...


class Gate(Control):
    """The lane gate of one candidate process: granted on LaneWanted, taken back on LaneReleased or close()."""

    def __init__(self, lane: Lane, who: Hashable, stop: Optional[threading.Event] = None):
        super().__init__(lane.device, stop)
        self.lane, self.who = lane, who
        self._r, self._w = os.pipe()
        self.fds = (self._r,)
        self.env[LANE_FD_ENV] = str(self._r)
        self._lock = threading.Lock()
        self._asked: Optional[float] = None  # waiting since
        self._held = self._closed = False
        self.waited = 0.0
        self.held_s = 0.0
        self._granted = 0.0

    def spawned(self) -> None:
        os.close(self._r)  # the child has its copy

    def on_message(self, msg: Message) -> None:
        with self._lock:
            if isinstance(msg, LaneWanted) and self._asked is None and not self._held and not self._closed:
                self._asked = time.monotonic()
                threading.Thread(target=self._grant, name="optagent-lane", daemon=True).start()
            elif isinstance(msg, LaneReleased) and self._held:
                self._give_back()
            # anything else (a second ask, a release not held) is a forgery the verdict rejects (verdict.ONCE)

    def _grant(self) -> None:
        got = self.lane.acquire(self.who)
        with self._lock:
            if self._asked is not None:
                self.waited += time.monotonic() - self._asked
                self._asked = None
            if not got:
                return
            if self._closed:
                self.lane.release(self.who)
                return
            self._held, self._granted = True, time.monotonic()
            try:
                os.write(self._w, b"\x01")
            except OSError:  # the child is gone; close() follows
                pass

    def _give_back(self) -> None:
        self._held = False
        self.held_s += time.monotonic() - self._granted
        self.lane.release(self.who)

    def waited_s(self) -> float:
        with self._lock:
            return self.waited + (time.monotonic() - self._asked if self._asked is not None else 0.0)

    def close(self) -> None:
        """The process has ended: its lane is free again, whatever it said."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._held:
                self._give_back()
            else:
                self.lane.cancel(self.who)
            os.close(self._w)


def _driver_gpus() -> int:
    """How many GPUs the driver reports, without importing torch (procfs, else nvidia-smi)."""
    procfs = Path("/proc/driver/nvidia/gpus")
    if procfs.is_dir():
        n = sum(1 for _ in procfs.iterdir())
        if n:
            return n
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU")) if out.returncode == 0 else 0
        except (OSError, subprocess.TimeoutExpired):
            return 0
    return 0


def visible_gpus() -> list[str]:
    """The GPUs this host lets us use, as CUDA_VISIBLE_DEVICES entries; without importing torch."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for item in (x.strip() for x in listed.split(",")):
            if not item or item.startswith("-"):
                break  # CUDA stops at the first invalid entry
            out.append(item)
        return out
    return [str(i) for i in range(_driver_gpus())]


def gpu_visible() -> bool:
    """Whether a CUDA GPU is visible here: one the driver reports, not hidden by CUDA_VISIBLE_DEVICES."""
    return bool(visible_gpus()) and _driver_gpus() > 0
    return []
