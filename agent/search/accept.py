"""When a candidate replaces the best kernel: the acceptance rule of a round.

On arrival (``first_look``) a passing candidate's outcome is final unless it may be faster:
- on the CPU (either timing from Triton's interpreter) it is PASSED: a node of the tree that may be a
  parent, never the best, for the interpreter's times are not GPU times. The best of a CPU run is the first
  kernel that passed, and no timing ever replaces it;
- not faster than the incumbent's recorded timing by more than min_gain: NOT_BETTER;
- else PENDING, decided once the round is in (``decide``): when some candidates gain more than
  max(CLEAR_GAIN, 3 x noise), which timing noise cannot do, on the lane that timed the incumbent, the
  largest gain among those wins unchecked. A gain between timings of two lanes (two GPUs, or two
  cluster actors, perhaps on two nodes) is never taken unchecked: it is re-timed.
  Otherwise the PENDING ones are re-timed together with the incumbent, back to back on one lane
  (one Pool.retime a round), and those still faster by more than max(min_gain, noise) clear the rule; the
  largest gain wins. The incumbent, when it stays, keeps its fresh timing.
A re-time is timing only (its process runs no checked run and no judge checks its outputs: the process can
tell), so it never makes a kernel faster than its judged timing: a candidate, and the incumbent, count with
the slower of the two (``judged_floor``), and one that works when first evaluated and cheats in a re-time
gains nothing by it. The incumbent keeps that fresh figure as its bar (a record taken on a slow stretch of
the host must not stay the bar), never one below its judged timing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from optagent.ranking import timings_rank
from optagent.schema import EvalResult, StepOutcome

# A gain this large cannot be timing noise (the same kernel's eager geomean moved 0.5-6% between two
# evaluations on an H200), so it is accepted without re-timing both kernels back to back:
# that re-timing costs more evaluations, minutes for the slow starters of big packages.
CLEAR_GAIN = 0.25


def noise(result: EvalResult) -> float:
    spreads = [c.time.spread for c in result.timed if c.time]
    return statistics.median(spreads) if spreads else 0.0


def gain(incumbent: EvalResult, result: EvalResult) -> Optional[float]:
    t_best, t_new = incumbent.geomean_time_us, result.geomean_time_us
    return t_best / t_new - 1 if t_best and t_new else None


def judged_floor(judged: EvalResult, retimed: EvalResult) -> EvalResult:
    """The re-time, unless it is faster than the judged timing (geomean): then the judged one."""
    t_judged, t_again = judged.geomean_time_us, retimed.geomean_time_us
    if retimed.status.ok and t_judged and t_again and t_again < t_judged:
        return judged
    return retimed


def first_look(incumbent: EvalResult, result: EvalResult, min_gain: float) -> StepOutcome:
    """A passing candidate's outcome as its result arrives (the module's first rule)."""
    if not timings_rank(results=(incumbent, result)):
        return StepOutcome.PASSED
    g = gain(incumbent, result)
    return StepOutcome.PENDING if g is not None and g > min_gain else StepOutcome.NOT_BETTER


@dataclass
class Verdict:
    outcome: StepOutcome
    note: str
    result: EvalResult  # the timing the step keeps: its own, or its re-time


@dataclass
class Decision:
    verdicts: dict[int, Verdict]  # every pending step's final word
    winner: Optional[int] = None  # the step that replaces the incumbent
    incumbent: Optional[EvalResult] = None  # the incumbent's fresh timing, when it stays and was re-timed


Retime = Callable[[Sequence[tuple[int, str]]], list[EvalResult]]  # (key, source) jobs, back to back


def decide(incumbent: tuple[int, str, EvalResult], pending: Sequence[tuple[int, str, EvalResult]],
           min_gain: float, retime: Retime) -> Decision:
    """The round's comparison (the module's second rule); ``retime`` is called at most once."""
    inc_step, inc_source, inc_result = incumbent
    gains = {i: gain(inc_result, r) or 0.0 for i, _, r in pending}
    clear = {i: gains[i] for i, _, r in pending if r.timed_on == inc_result.timed_on
             and gains[i] > max(CLEAR_GAIN, 3 * max(noise(inc_result), noise(r)))}
    if clear and any(gains[i] > max(clear.values()) for i, _, r in pending if r.timed_on != inc_result.timed_on):
        clear = {}  # another lane's timing claims more: only a back-to-back re-time can compare them
    if clear:
        won = max(clear, key=lambda i: (clear[i], -i))
        verdicts = {}
        for i, _, r in pending:
            head = f"gain {gains[i]:+.1%} over the incumbent's recorded timing"
            if i == won:
                spread = max(noise(inc_result), noise(r))
                verdicts[i] = Verdict(StepOutcome.ACCEPTED, f"{head}, far above the noise ({spread:.1%}): "
                                                            "not re-timed", r)
            else:
                verdicts[i] = Verdict(StepOutcome.NOT_BETTER, f"{head}; step {won} gained more: not re-timed", r)
        return Decision(verdicts, won)
    again = retime([(inc_step, inc_source)] + [(i, src) for i, src, _ in pending])
    again = [judged_floor(r, a) for r, a in zip([inc_result] + [r for _, _, r in pending], again)]
    again_best, fresh = again[0], bool(again[0].status.ok and again[0].geomean_time_us)
    verdicts, cleared = {}, {}
    for (i, _, first), again_new in zip(pending, again[1:]):
        if not again_new.status.ok:
            verdicts[i] = Verdict(StepOutcome.FAILED, "failed when re-timed", again_new)
        elif not fresh or not again_new.geomean_time_us:
            verdicts[i] = Verdict(StepOutcome.NOT_BETTER, "the incumbent could not be re-timed", first)
        else:
            g = gain(again_best, again_new) or 0.0
            spread = max(noise(again_best), noise(again_new))
            note = (f"re-timed back to back: incumbent {again_best.geomean_time_us:.1f} us, candidate "
                    f"{again_new.geomean_time_us:.1f} us (geomean), gain {g:+.1%}, noise {spread:.1%}")
            verdicts[i] = Verdict(StepOutcome.NOT_BETTER, note, again_new)
            if g > max(min_gain, spread):
                cleared[i] = g
    won = max(cleared, key=lambda i: (cleared[i], -i)) if cleared else None
    for i in cleared:
        if i == won:
            verdicts[i].outcome = StepOutcome.ACCEPTED
        else:
            verdicts[i].note += f"; step {won} gained more"
    # The incumbent stays with this timing, taken side by side with the candidates: a record taken on a slow
    # stretch of the host would let a later candidate that is no faster clear CLEAR_GAIN against it unchecked.
    return Decision(verdicts, won, again_best if fresh and won is None else None)
