"""What the referee (evaluation/referee.py) files of each timed loop: its windows, the calls it keeps for the
judge, and the native clock's own answers, which its thread files as if it had made them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Calls kept for the judge per loop (worker/candidate.py's SAMPLED_CALLS), at most and at least (a kernel that says
# its outputs are too large to keep many is still checked); timer.c's MAX_KEEP and REF_MIN_KEEP: its clock keeps too
MAX_KEEP = 32
MIN_KEEP = 2


@dataclass
class KeptCall:
    """A timed call the judge checks: its set, its inputs' seed (None: the base inputs), its outputs' digest."""

    call: int
    set: int
    seed: Optional[int]
    digest: str


@dataclass
class RefereeLoop:
    label: str
    baseline: bool
    n_sets: int
    calls_us: list[float] = field(default_factory=list)  # one per timed call: T's answer to D
    between_us: list[float] = field(default_factory=list)  # D's answer to the next call's T
    kept: dict[int, KeptCall] = field(default_factory=dict)
    closed: bool = False
    keep_target: int = MIN_KEEP  # its reservoir (_reservoir): how many calls it keeps, and how many it has seen
    seen: int = 0
    expect: str = "T"  # the next mark or question of a timed call: T, D, R
    digest_us: Optional[float] = None  # the last call's window from D's answer to its R (its time between begins)

    @property
    def call_us(self) -> Optional[float]:
        """The low quartile of its call windows: what three calls in four took at least. On the H200 a call's window
        now and then holds another process's time slice on the GPU (a judge's), or a slow host's spell, which the
        timer's claim leaves out (its calls at the host's usual speed); the kernel's own time is in every call."""
        return quantile(self.calls_us, 0.25)

    @property
    def between_low_us(self) -> Optional[float]:
        """The low decile of the time between calls: work moved there is in every gap, a busy host's spells are not."""
        return quantile(self.between_us, 0.1)


@dataclass(frozen=True)
class Answer:
    """An R's answer as the native clock made it (timer.c optagent_referee_clock): the thread files it."""

    seed: int
    keep: bool
    drop: int


def clock_stamp(stamp: bytes) -> tuple[float, Optional[Answer]]:
    """A relayed line's stamp: its window, and the clock's answer where it answered the question itself."""
    window, *answer = stamp.split(b":")
    if len(answer) != 3:
        return float(window), None
    seed, keep, drop = (int(x) for x in answer)
    return float(window), Answer(seed, keep == 1, drop)


def quantile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[int(len(ordered) * q)]
