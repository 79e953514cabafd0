"""The host's memory touched once, in the background, before the pool's processes need it (issue 31).

On the lent GPU machines (virtual machines whose memory the hypervisor backs only as it is first touched), fresh
processes ran Python at half speed in 4 of 6 starts until 16 GiB had been written once; after it, 6 of 6 ran at
the usual speed (bench/host_memory.py on an H100 machine, 2026-12-07: a loop's median 471 us, slowest / fastest
1.98, then 226 us, 1.03). A candidate's eager time is mostly its launch through Python, so its process's speed is
its timing's. A pool on a GPU therefore starts one low-priority process that writes a byte in every page of up to
`touch_gib` GiB (a quarter of the memory available at most) and frees it: the pages a later process gets are
then ones the host has already backed. Elsewhere the touch costs a few seconds of one core, once a run. No timed
phase runs beside it: each lane's grant waits for it to end (at most WAIT_S), as for start-ups (Lane.settle); the
spares' start-ups, compiles and checked runs do.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from optagent.evaluation.lanes import Lane
from optagent.evaluation.limits import meminfo_bytes
from optagent.schema import Device

SHARE = 0.25  # of MemAvailable, at most
WAIT_S = 30.0  # the longest a lane's grant waits for the touch (16 GiB took 9 s on an H100 machine), then it stops
_touches: list[Optional[subprocess.Popen]] = []  # this process's one touch (or None: nothing to touch)
_lock = threading.Lock()
# mmap'd one GiB at a time, one byte written per page, unmapped: nothing is kept, nothing is read
CHILD = """
import mmap, os, sys
os.nice(19)
for _ in range(int(sys.argv[1])):
    m = mmap.mmap(-1, 1 << 30)
    for at in range(0, 1 << 30, mmap.PAGESIZE):
        m[at] = 1
    m.close()
"""


def available_gib() -> float:
    """MemAvailable in GiB (0 where /proc/meminfo says nothing)."""
    return (meminfo_bytes("MemAvailable") or 0) / (1 << 30)


def gib_to_touch(wanted: int) -> int:
    return max(0, min(wanted, int(available_gib() * SHARE)))


def touch_in_background(wanted_gib: int) -> Optional[subprocess.Popen]:
    """Start the touch (None when there is nothing to touch); the caller reaps it (finish)."""
    gib = gib_to_touch(wanted_gib)
    if gib <= 0:
        return None
    return subprocess.Popen([sys.executable, "-c", CHILD, str(gib)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def finish(proc: Optional[subprocess.Popen]) -> None:
    """Stop a touch still running (a short run, Ctrl-C) and reap it."""
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def touch_before_timing(lanes: Sequence[Lane], wanted_gib: int, device: Device) -> Optional[subprocess.Popen]:
    """On a GPU, start the touch and make each lane's grants wait for its end before their own settle (if any).
    Once a process: what the host backed stays backed, so a later pool (the MCP server's next run, a bench's next
    width) only waits for the touch still running, if it is.
    """
    if device is not Device.CUDA:
        return None
    with _lock:
        if not _touches:
            _touches.append(touch_in_background(wanted_gib))
        proc = _touches[0]
    if proc is None or proc.poll() is not None:
        return None
    for lane in lanes:
        lane.settle = _after(proc, lane.settle)
    return proc


def _after(proc: subprocess.Popen, then: Optional[Callable[[], float]]) -> Callable[[], float]:
    def settle() -> float:
        t0 = time.monotonic()
        try:
            proc.wait(timeout=max(0.0, WAIT_S - (t0 - started)))
        except subprocess.TimeoutExpired:
            proc.kill()  # a host too slow to write it in WAIT_S: what it wrote stands
        return time.monotonic() - t0 + (then() if then is not None else 0.0)

    started = time.monotonic()
    return settle
