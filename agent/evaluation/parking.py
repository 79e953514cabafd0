"""Parent side: while one process holds a lane alone (its timed phase, a baseline job, a re-time), the lane's other
candidate processes are stopped (SIGSTOP), and continued when the hold ends.

Why: a candidate's code is meant to run only inside a hold of its lane (its correctness runs shared, its timed
phase alone), but a process has ways to run it outside: a thread it started, a signal handler (an interval
timer) while its harness waits for the timed phase's grant, a correctness run that outlasts the wait a timed
phase gives it (lanes.MEMBER_WAIT_S). Any of these could launch GPU work or take cores beside another
candidate's timed calls, or the baselines', and stretch them. A stopped process runs nothing, in any thread.
What a process queued on its GPU before it was stopped still runs to its end: the harness syncs the device
after each checked run, a bound an honest process keeps and a hostile one can break (docs/gpu.md, issue 31).

A member is a process that has compiled its candidate (evaluation/gates.py Gate: the harness says Compiled
before any candidate code exists in the process): a warm spare, a judge, a baseline job and a process still
compiling are not members and are never stopped. A member's processes are those below the worker (under
bubblewrap, its whole PID namespace, which no process can leave), its process group, and those carrying its
marker. Time stopped is not counted against the process's timeout (Gate.waited_s).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Hashable, Optional, Protocol

from optagent.evaluation.limits import tree_pids
from optagent.evaluation.worker_command import MARKER

ROUNDS = 3  # passes over a member's processes when stopping it: one forked meanwhile is found by the next


def marked_pids(marker: str) -> list[int]:
    """Processes (not this one) whose environment carries this worker's marker: those that left its group."""
    needle, found = f"{MARKER}={marker}".encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in (Path("/proc") / str(pid) / "task").iterdir():
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return found


def _signal(pids: set[int], group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Member(Protocol):
    """What the lane stops: one worker process (evaluation/gates.py Gate)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Processes:
    """One worker's processes, stopped and continued as one."""

    def __init__(self, pid: int, marker: str):
        self.pid, self.marker = pid, marker
        self.stopped: set[int] = set()

    def stop(self) -> None:
        new = set(tree_pids(self.pid)) | set(marked_pids(self.marker))
        for _ in range(ROUNDS):  # then the children of those stopped (forked meanwhile): a walk of theirs, not /proc's
            new -= self.stopped
            if not new:
                break
            self.stopped |= new
            _signal(new, self.pid, signal.SIGSTOP)
            new = {child for pid in new for child in _children(pid)}

    def cont(self) -> None:
        _signal(self.stopped, self.pid, signal.SIGCONT)
        self.stopped.clear()


class Parking:
    """A lane's members, and the holder they are stopped for (one at a time: a lane has one holder)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[Hashable, Member] = {}
        self._holder: Optional[Hashable] = None
        self._stopped: dict[Hashable, Member] = {}
        self.stops = 0  # members stopped, in all (tests, bench/)
        self.stopping_s = 0.0  # how long stopping them took, in all

    def enter(self, who: Hashable, member: Member) -> None:
        """`who` may run candidate code from now on: stopped at once if another process holds the lane alone."""
        with self._lock:
            self._members[who] = member
            if self._holder is not None and self._holder != who:
                self._stop(who, member)

    def member(self, who: Hashable) -> bool:
        with self._lock:
            return who in self._members

    def leave(self, who: Hashable) -> None:
        """`who`'s process has ended."""
        with self._lock:
            self._members.pop(who, None)
            self._stopped.pop(who, None)

    def park(self, holder: Hashable) -> None:
        """`holder` holds the lane alone: every other member stopped (and the holder running)."""
        with self._lock:
            self._holder = holder
            for who, member in self._members.items():
                if who != holder and who not in self._stopped:
                    self._stop(who, member)
            if holder in self._stopped:
                self._stopped.pop(holder).resume()

    def unpark(self, holder: Hashable) -> None:
        with self._lock:
            if self._holder != holder:
                return
            self._holder = None
            for member in self._stopped.values():
                member.resume()
            self._stopped.clear()

    def _stop(self, who: Hashable, member: Member) -> None:
        t0 = time.monotonic()
        member.pause()
        self._stopped[who] = member
        self.stops += 1
        self.stopping_s += time.monotonic() - t0
