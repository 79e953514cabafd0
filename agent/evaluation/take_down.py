"""Parent side: a worker process taken down once it has ended or must end, its whole group and whatever slipped
out of the group but still carries the run's marker in its environment (without a PID namespace).

A judge that has answered is taken down in the background (in_background): trusted, it has nothing more to say,
and a GPU process's exit takes its context's teardown, which its verdicts need not wait for. Whoever counts
processes (a pool's close, tests) waits for those first (reaped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, Optional

from optagent.evaluation.gates import Control
from optagent.evaluation.limits import Watch
from optagent.evaluation.parking import marked_pids

KILL_WAIT_S = 30.0  # after SIGKILL: a process the kernel cannot take down yet is left, not waited on


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_marked(marker: str) -> None:
    """Kill processes that left the group (setsid) but still carry this run's marker."""
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def take_down(proc: subprocess.Popen, watch: Watch, marker: str, control: Control, wait_s: float) -> Optional[str]:
    """Wait up to wait_s for the worker's end, still watched (the limit it broke meanwhile, if any, is returned),
    then kill what is left of its group and of its marked processes, and free its lane."""
    try:
        late = watch.wait(proc, wait_s)
    except subprocess.TimeoutExpired:
        late = None
    if late or proc.returncode is None:
        kill_group(proc.pid)
        try:  # a process stuck in the kernel (D state) is not waited for forever
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid)  # children the worker left behind in its group
    kill_marked(marker)
    control.close()  # its lane, if it held one, is free
    return late


_ending: set[threading.Thread] = set()
_lock = threading.Lock()


def in_background(proc: subprocess.Popen, watch: Watch, marker: str, control: Control,
                  after: Callable[[], object]) -> None:
    """take_down in a thread of its own, then `after` (the log's close)."""
    def down() -> None:
        try:
            take_down(proc, watch, marker, control, KILL_WAIT_S)
            after()
        finally:
            with _lock:
                _ending.discard(thread)
    thread = threading.Thread(target=down, name="optagent-take-down", daemon=True)
    with _lock:
        _ending.add(thread)
    thread.start()


def reaped(timeout_s: float = KILL_WAIT_S) -> None:
    """Wait (at most timeout_s in all) for the workers still being taken down in the background."""
    deadline = time.monotonic() + timeout_s
    with _lock:
        ending = list(_ending)
    for thread in ending:
        thread.join(max(0.0, deadline - time.monotonic()))
