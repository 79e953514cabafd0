"""What the referee's log says of a candidate's timed calls (parent side): the figures the verdict holds the
timer's records against (evaluation/verdict.py), and the calls the judge checks.

The referee's figure for a call: its call windows' low quartile (RefereeLoop.call_us) less the harness's own share
of a window (the marks' round trips and the sync), plus the time between calls beyond what the harness's own work
there took in a trusted loop of the same case, past that work's noise (MOVED_SLACK). The recorded time is never far
below that figure (floor_us); a claim far below it was forged, and a loop whose work lies mostly between its calls
moved it out of them: both rejected. The trusted loop is the baseline's, timed before any candidate code existed in
its process (this process's, or the lane's baseline job's: Baseline.over_us and between_us).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Optional

from optagent.evaluation.referee import Referee
from optagent.evaluation.referee_loops import RefereeLoop
from optagent.evaluation.timer_check import MOVED
from optagent.messages import Baseline, ExpectedSample, Job
from optagent.schema import Device
from optagent.timer_records import set_seed, timed_name

# A claim this far under the figure is forged: (times the claim, and microseconds more). On the H200 honest claims
# came within 0.88-1.14x of the figure (docs/gpu.md, 2026-12-04); a CPU's interpreted calls move more with the host.
FORGED = {Device.CUDA: (1.5, 20.0), Device.CPU: (4.0, 20_000.0)}
# The time between calls that is still the harness's own, beyond a trusted loop's low decile: (a share of it,
# microseconds). On the H200 honest candidates' gaps ran up to 415 us (1.7x) over the lane's baseline's (the
# harness's Python between calls, the GPU shared with judges); a CPU's interpreter moves them more.
MOVED_SLACK = {Device.CUDA: (1.0, 500.0), Device.CPU: (3.0, 100_000.0)}
# The figure moves with the host: a claim this close under it stands, a lower one is recorded at floor_us.
RESOLUTION = (0.03, 2.0)  # (a share of the figure, and microseconds more)
# A call left near empty, its work between the calls: the time between calls beyond the trusted loop's is this many
# times the claim, and this many microseconds more. On a CPU the noise MOVED_SLACK allows (a loaded host's 100 ms) is
# as much as an interpreted kernel's whole work, so a kernel moved out whole could hide in it (the decode smoke case's
# 105 ms did, once the trusted loop's gaps read 6 ms); a loaded host stretched honest gaps to 2x their calls' time.
# On a GPU the slack is tight enough, and moved_us > claim decides.
EMPTIED = {Device.CPU: (10.0, 20_000.0)}
NOT_THE_HARNESS = "the timing was not the harness's"  # a forged claim's verdict ends so (evaluation/pool.py reads it)


@dataclass(frozen=True)
class Calibration:
    """A trusted loop's share of the harness's own work under the referee: in a call's window (the same for every
    case: the median of the cases'), and between calls (the case's own)."""

    call_over_us: float
    between_us: Optional[float]


def _across(per_case: dict[str, tuple[float, Optional[float]]]) -> dict[str, Calibration]:
    """A call window's overhead is the marks' and the sync's, whatever the case: one case's figure can be off when its
    claim came from a retried loop (a slow host) that its windows do not match, so each case gets the cases' median."""
    if not per_case:
        return {}
    over = median(o for o, _ in per_case.values())
    return {label: Calibration(over, between) for label, (_, between) in per_case.items()}


def case_figures(referee: Optional[Referee], label: str, claim: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """A baseline loop's own: its call window's overhead beyond the baseline's claim, and its time between calls."""
    lp = referee.loop(label, True) if referee else None
    if lp is None or lp.call_us is None or claim is None:
        return None, None
    return max(0.0, lp.call_us - claim), lp.between_low_us


def own_calibration(referee: Optional[Referee], claims: dict[str, Optional[float]]) -> dict[str, Calibration]:
    """From this process's baseline loops and the baseline's claims (case -> median us)."""
    figures = {label: case_figures(referee, label, claim) for label, claim in claims.items()}
    return _across({label: (over, between) for label, (over, between) in figures.items() if over is not None})


def lane_calibration(baselines: dict[str, Baseline]) -> dict[str, Calibration]:
    """From a lane's baseline job (its Baseline messages, each with this module's figures set by the parent)."""
    return _across({label: (b.over_us, b.between_us) for label, b in baselines.items() if b.over_us is not None})


def unrefereed(referee: Referee, timed: list[str]) -> Optional[str]:
    """Why the referee's log does not cover the timed cases (a question out of turn, a loop not made), or None."""
    if referee.violation:
        return f"the referee stopped answering: {referee.violation}"
    for label in timed:
        lp = referee.loop(label, False)
        if lp is None or not lp.calls_us or not lp.kept:
            return f"case {label}: its timed calls were not made under the referee (the harness's loop did not run)"
    return None


def floor_us(seen: float) -> float:
    """The least time recorded for a call the referee's clock saw take `seen` microseconds."""
    share, us = RESOLUTION
    return max(0.0, seen * (1.0 - share) - us)


def gap_excess_us(lp: RefereeLoop, cal: Calibration) -> Optional[float]:
    """The time between this loop's calls beyond the trusted loop's (None: either is missing)."""
    if lp.between_low_us is None or cal.between_us is None:
        return None
    return lp.between_low_us - cal.between_us


def moved_us(lp: RefereeLoop, cal: Calibration, device: Device) -> float:
    """The time between this loop's calls beyond the trusted loop's and its noise: work moved out of the call."""
    excess = gap_excess_us(lp, cal)
    if excess is None or cal.between_us is None:
        return 0.0
    share, us = MOVED_SLACK[device]
    return max(0.0, excess - max(share * cal.between_us, us))


def seen_us(lp: RefereeLoop, cal: Optional[Calibration], device: Device) -> Optional[float]:
    """The referee's time a call (None: not calibrated)."""
    if cal is None or lp.call_us is None:
        return None
    return max(0.0, lp.call_us - cal.call_over_us) + moved_us(lp, cal, device)


def forged_claim(label: str, lp: RefereeLoop, claim_us: float, cal: Optional[Calibration],
                 device: Device) -> Optional[str]:
    """Why the timer's claim for this loop is far shorter than the referee's clock allows, or None."""
    seen = seen_us(lp, cal, device)
    if seen is None or cal is None:
        return None
    moved = moved_us(lp, cal, device)
    excess = gap_excess_us(lp, cal) or 0.0
    emptied = device in EMPTIED and excess > EMPTIED[device][0] * claim_us + EMPTIED[device][1]
    if moved > claim_us or emptied:  # most of the work is done between the calls, the timed call left with little
        return (f"case {label}: {lp.between_low_us:.0f} us passed between its timed calls (eager loop) by the referee's "
                f"clock, against {cal.between_us:.0f} us of the harness's own work there in the baseline's loop, and "
                f"{claim_us:.0f} us a call: {MOVED}")
    factor, more_us = FORGED[device]
    if seen > claim_us * factor + more_us:
        return (f"case {label}: the timer's records give {claim_us:.0f} us a call, but the referee's own clock saw "
                f"{seen:.0f} us a call ({lp.call_us:.0f} us in three call windows of four, less {cal.call_over_us:.0f}"
                f" us of the harness's own): {NOT_THE_HARNESS}")
    return None


def expected_calls(job: Job, referee: Referee, timed: list[str]) -> dict[str, list[ExpectedSample]]:
    """The timed calls the judge checks: those the referee kept, with its seeds and the digests told to it."""
    out: dict[str, list[ExpectedSample]] = {}
    for label in timed:
        lp = referee.loop(label, False)
        out[label] = [ExpectedSample(name=timed_name(c.call), base_seed=set_seed(job, c.set), refresh_seed=c.seed,
                                     digest=c.digest) for c in (lp.kept.values() if lp else ())]
    return out
