"""How fast the host runs right now: the part of eager-time noise that is not the kernel's.

On the lent GPU machines a fixed pure-Python loop takes either its usual time or about
twice that, for stretches of seconds (bench/host_noise.py; docs/gpu.md). An eager timing
is the host's launch work plus the GPU's, so a stretch at half speed moves it by tens of
percent. Each timed call is therefore paired with a ~10 us probe run just before it,
outside the timed region, and the estimate keeps the calls whose probe ran at the usual
speed: the fastest probe seen on this machine (cached per CPU model and Python version)
or in this loop, with some slack. When too few calls qualify, the timer waits a moment
for the usual speed and times again; if the host stays slow, every call counts and the
timing says so, and the process waits no more: a slow stretch lasts seconds, and on the H200
a CUDA decode candidate's timed phase spent 3.6 of its 5.2 s in waits that mostly found the
host still slow (docs/gpu.md, 2026-12-04).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

from optagent.cache import cache_root, write_json
from optagent.enums import TimerKind

_perf_counter = time.perf_counter  # bound at import, before any candidate code
PROBE_N = 1000  # ~10 us of bytecode on a current x86 core
SLACK = 1.3  # a probe this much over the usual speed marks its call as taken on a slow host
MIN_KEPT = 0.2  # fewer calls than this fraction at the usual speed: keep them all, flag it


def probe_us() -> float:
    t0 = _perf_counter()
    sum(range(PROBE_N))
    return (_perf_counter() - t0) * 1e6


def wait_for_usual(usual: float, max_s: float) -> bool:
    """Polls until the probe runs at the usual speed again; False after max_s seconds."""
    end = _perf_counter() + max_s
    while min(probe_us() for _ in range(3)) > SLACK * usual:
        if _perf_counter() >= end:
            return False
        time.sleep(0.02)
    return True


class WaitBudget:
    """A process's waits for the usual speed before a slow loop is timed again, for either timer: each_s at most
    each, total_s in all, and none after one that found the host still slow (the module's note says why)."""

    def __init__(self, each_s: float, total_s: float):
        self.each_s, self.left = each_s, total_s

    def wait(self, wait_for: Callable[[float], bool]) -> bool:
        """wait_for(max_s): the timer's own wait; whether the host is at its usual speed again."""
        if self.left <= 0:
            return False
        t0 = _perf_counter()
        usual = wait_for(min(self.each_s, self.left))
        self.left = self.left - (_perf_counter() - t0) if usual else 0.0
        return usual


def _machine_key() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} / python {sys.version_info[0]}.{sys.version_info[1]}"


def usual_probe_us(seen: float, timer: TimerKind = TimerKind.PYTHON) -> float:
    """The fastest probe on record for this machine, updated with `seen` when it is faster. Each timer has its own
    probe (this module's in Python, the native timer's in C), so each its own record. Only trusted workers (the
    lane's baseline job, the judge) may write the cache (evaluation/isolation.py): a candidate reads the record."""
    path, key = cache_root() / "host_probe.json", _machine_key()
    if timer is not TimerKind.PYTHON:
        key = f"{key} / {timer.value} timer"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    best = cache.get(key)
    if isinstance(best, (int, float)) and 0 < best <= seen:
        return float(best)
    cache[key] = seen
    try:
        write_json(path, cache)
    except OSError:
        pass  # a read-only cache only costs the record
    return seen


def at_usual_speed(samples: list[float], probes: list[float], usual: float) -> tuple[list[float], bool]:
    """The samples whose probe ran at the usual speed, and whether the host was slow instead."""
    ref = min([usual, *probes])
    kept = [s for s, p in zip(samples, probes) if p <= SLACK * ref]
    if len(kept) >= max(3, MIN_KEPT * len(samples)):
        return kept, False
    return samples, True
