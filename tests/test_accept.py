"""The acceptance rule of a round (search/accept.py), on made-up results: which gains are taken unchecked."""

from __future__ import annotations

from typing import Optional

import pytest

from optagent.schema import CaseKind, CaseResult, Device, EvalResult, Language, Status, StepOutcome, Timing
from optagent.search.accept import decide


def result(us: float, lane: Optional[str], spread: float = 0.02) -> EvalResult:
    t = Timing(median_us=us, p10_us=us * (1 - spread), p90_us=us * (1 + spread), samples=20)
    case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time=t, time_us=us, baseline_us=1000.0)
    return EvalResult(status=Status.PASSED, language=Language.TRITON, device=Device.CUDA, source_sha256="0" * 64,
                      cases=[case], wall_s=1.0, timed_on=lane)


class Retimer:
    """Back to back on one lane: the incumbent at 100 us, each candidate at the time given."""

    def __init__(self, times: dict[int, float]):
        self.times, self.calls = times, []

    def __call__(self, jobs):
        self.calls.append([key for key, _ in jobs])
        return [result(self.times.get(key, 100.0), "lane 0") for key, _ in jobs]


def test_a_clear_gain_on_the_incumbents_lane_is_taken_unchecked():
    retime = Retimer({})
    got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(50.0, "lane 0"))], 0.02, retime)
    assert got.winner == 1 and not retime.calls
    assert "not re-timed" in got.verdicts[1].note


def test_a_clear_gain_between_two_lanes_is_re_timed_on_one():
    """A faster GPU (or another node's) would make any kernel look faster: the gain is measured again."""
    for lane in ("lane 1 (GPU 1)", "lane 0 on node-b (actor pid 7)", None):
        retime = Retimer({1: 99.0})  # back to back, the gain is within noise
        got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(50.0, lane))], 0.02, retime)
        assert retime.calls == [[0, 1]], lane
        assert got.winner is None and got.verdicts[1].outcome is StepOutcome.NOT_BETTER
        assert "re-timed back to back" in got.verdicts[1].note


def test_across_lanes_a_real_gain_still_wins_once_re_timed():
    pending = [(1, "s1", result(50.0, "lane 1 (GPU 1)")), (2, "s2", result(55.0, "lane 0"))]
    # step 2's clear gain is on the incumbent's lane, but step 1's timing, from another lane, claims
    # more: the round is re-timed back to back, and step 1 wins on the one lane
    retime = Retimer({1: 60.0, 2: 90.0})
    got = decide((0, "src0", result(100.0, "lane 0")), pending, 0.02, retime)
    assert retime.calls == [[0, 1, 2]] and got.winner == 1
    assert got.verdicts[1].outcome is StepOutcome.ACCEPTED and "step 1 gained more" in got.verdicts[2].note
    # another lane claiming less than the incumbent's lane's clear gain: that one wins unchecked
    retime = Retimer({})
    pending = [(1, "s1", result(80.0, "lane 1 (GPU 1)")), (2, "s2", result(55.0, "lane 0"))]
    got = decide((0, "src0", result(100.0, "lane 0")), pending, 0.02, retime)
    assert got.winner == 2 and not retime.calls


def test_an_unjudged_re_time_never_makes_a_candidate_faster_than_its_judged_timing():
    """A re-time runs no judge (evaluation/pool.py): a candidate that is honest when first evaluated (judged,
    90 us, a 10% gain: re-timed) and cheats in the re-time (40 us) counts with its judged 90 us."""
    retime = Retimer({1: 40.0})
    got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(90.0, "lane 0"))], 0.02, retime)
    assert retime.calls == [[0, 1]]
    assert got.winner == 1 and got.verdicts[1].result.geomean_time_us == 90.0
    # an honest candidate slower when re-timed keeps the slower, re-timed figure: it may then lose
    retime = Retimer({1: 99.5})
    got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(90.0, "lane 0"))], 0.02, retime)
    assert got.winner is None and got.verdicts[1].result.geomean_time_us == pytest.approx(99.5)


def test_an_incumbent_faster_in_its_re_time_than_when_judged_keeps_its_judged_timing():
    """A re-time's process can tell it is one (no checked runs): an incumbent that works when judged (100 us) and
    cheats when re-timed (50 us) neither stops a real gain nor keeps the forged figure as the bar."""
    retime = Retimer({0: 50.0, 1: 90.0})
    got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(90.0, "lane 0"))], 0.02, retime)
    assert got.winner == 1, got.verdicts[1].note
    retime = Retimer({0: 50.0, 1: 99.0})  # no gain: the incumbent stays, at its judged 100 us, not at 50
    got = decide((0, "src0", result(100.0, "lane 0")), [(1, "src1", result(99.0, "lane 0"))], 0.02, retime)
    assert got.winner is None and got.incumbent.geomean_time_us == pytest.approx(100.0)
