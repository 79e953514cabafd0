"""The candidate process's threads as the kernel counts them (worker side).

The harness's own check (candidate.py) sees threads with a Python state only; a thread made natively
(``pthread_create`` through ctypes, a C extension's worker) is invisible there. /proc/self/task lists every
one. A new thread that idles is harmless (PyTorch's CPU pool starts lazily at the first parallel op, the
CUDA driver keeps helpers), one that still burns CPU after run_kernel returned and the device synchronised
is work outside the call: rejected. Busy means runnable at both ends of a short window and on a CPU for
more than BUSY_SHARE of it (a loaded host gives a spinning thread only part of a core), read from the
kernel's per-thread state and run time (schedstat: nanoseconds; stat's ticks where it is missing).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

TASKS = Path("/proc/self/task")
WINDOW_S, BUSY_SHARE = 0.05, 0.1
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def native_threads() -> set[int]:
    """Every thread of this process, by its kernel id."""
    try:
        return {int(name) for name in os.listdir(TASKS)}
    except OSError:
        return set()


def _sample(tid: int) -> Optional[tuple[str, float]]:
    """The thread's state letter (R: running or runnable) and its time on a CPU so far in nanoseconds;
    None once it has exited."""
    try:  # state, utime and stime: fields 3, 14 and 15, after the parenthesised name (which may hold spaces)
        fields = (TASKS / str(tid) / "stat").read_text().rsplit(")", 1)[1].split()
        state, ticks = fields[0], (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (OSError, IndexError, ValueError):
        return None
    try:
        return state, float((TASKS / str(tid) / "schedstat").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return state, ticks


def busy_new_threads(before: set[int]) -> list[int]:
    """The threads started since `before` that are still running code (busy over the window); [] at once
    when none was started."""
    new = sorted(native_threads() - before - {os.getpid()})
    if not new:
        return []
    first = {tid: _sample(tid) for tid in new}
    time.sleep(WINDOW_S)
    busy = []
    for tid, a in first.items():
        b = _sample(tid)
        if a and b and a[0] == b[0] == "R" and b[1] - a[1] > BUSY_SHARE * WINDOW_S * 1e9:
            busy.append(tid)
    return busy
