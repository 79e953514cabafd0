"""The referee (evaluation/referee.py): the trusted side of every timed call.

Its protocol is driven here by hand, as a harness (or a candidate lying to it) would; then real
evaluations show what it holds: an honest kernel passes with its time never below the referee's,
a kernel whose timer claims a hundredth of its time is rejected, and a kernel that makes its
answers only when the harness saves them, after the loop, is rejected by the digests it told.
"""

from __future__ import annotations

import os
import time

import pytest
from attack_fixtures import attack  # tests/ is on sys.path

from optagent.evaluation import evaluator as evaluator_module
from optagent.evaluation import referee as ref
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.messages import Job
from optagent.schema import Device, Language, Status
from optagent.task import load_task


class Harness:
    """The worker's side of a referee's pipes, driven by the test."""

    def __init__(self) -> None:
        self.referee = ref.Referee()
        self.answers, self.questions = (os.dup(fd) for fd in self.referee.child_fds)
        self.referee.started()

    def ask(self, question: str) -> list[str]:
        os.write(self.questions, question.encode() + b"\n")
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(self.answers, 1)
            if not chunk:
                return []
            line += chunk
        return line.decode().split()

    def close(self) -> ref.Referee:
        os.close(self.questions)
        os.close(self.answers)
        return self.referee.finish()


def test_the_referee_draws_the_seeds_keeps_calls_after_their_digests_and_times_each_window():
    h = Harness()
    assert h.ask("B smoke-1 eager 1 3") == ["G"]
    warm = [h.ask("W 0") for _ in range(2)]
    seeds = {int(a[1]) for a in warm}
    kept = set()
    for call in range(8):
        time.sleep(0.01 * (call % 2 + 1))  # the "call": 10 or 20 ms, by the referee's clock
        s, seed, keep, drop = h.ask(f"R {call} 0 {'ab' * 32}")
        assert s == "S"
        seeds.add(int(seed))
        if keep == "1":
            kept.add(call)
        kept.discard(int(drop))
    assert h.ask("E") == ["G"]
    r = h.close()
    lp = r.loop("smoke-1", False)
    assert r.violation is None and lp is not None and lp.closed
    assert len(seeds) == 10  # every redraw its own seed, drawn by the referee
    assert set(lp.kept) == kept and len(kept) == 3  # the harness was told which calls to keep
    # each kept call's inputs: the seed its set was last redrawn with before it
    assert all(c.seed is not None and c.digest == "ab" * 32 for c in lp.kept.values())
    assert len(lp.windows_us) == 8 and 13_000 < lp.median_us < 40_000, lp.windows_us


@pytest.mark.parametrize("questions,why", [
    (["R 0 0 " + "ab" * 32], "outside any timed loop"),
    (["B smoke-1 eager 1 3", "R 1 0 " + "ab" * 32], "out of order"),
    (["B smoke-1 eager 1 3", "R 0 5 " + "ab" * 32], "input set 5"),
    (["B smoke-1 eager 1 3", "T 0"], "never asks"),
    (["B smoke-1 eager 1 3", "B smoke-2 eager 1 3"], "inside another"),
    # two sets: the second's inputs, drawn a call ahead, could be answered in the first's window
    (["B smoke-1 eager 2 3"], "over 2 input sets"),
])
def test_a_question_out_of_turn_ends_the_answers(questions, why):
    h = Harness()
    answers = [h.ask(q) for q in questions]
    assert answers[-1] == [] and all(answers[:-1])  # the pipe closed: the worker's harness cannot go on
    r = h.close()
    assert why in (r.violation or ""), r.violation
    assert why in (ref.unrefereed(r, ["smoke-1"]) or "")


def test_a_claim_far_below_the_referees_clock_is_forged_and_no_time_is_recorded_below_it():
    lp = ref.RefereeLoop("smoke-1", False, 2, windows_us=[110_000.0, 130_000.0], closed=True)
    assert ref.seen_us(lp, 20_000.0) == pytest.approx(100_000.0)
    assert ref.forged_claim("smoke-1", lp, 1_000.0, 20_000.0)  # a hundredth
    assert ref.forged_claim("smoke-1", lp, 95_000.0, 20_000.0) is None  # a median a little under the mean
    assert ref.forged_claim("smoke-1", lp, 1_000.0, None) is None  # not calibrated: no word


def test_a_stalled_window_neither_forges_an_honest_claim_nor_hides_a_forged_one():
    """A loaded host stalls a window now and then (seen in CI: 200 ms in a loop of 30 ms calls); the
    referee's median window holds against one, in the candidate's loop and in the baseline's alike."""
    stalled = ref.RefereeLoop("smoke-1", False, 1, windows_us=[30_200.0, 600_000.0, 30_300.0], closed=True)
    assert ref.forged_claim("smoke-1", stalled, 30_000.0, 200.0) is None
    assert ref.forged_claim("smoke-1", stalled, 1.0, 200.0)  # forged: its calls' own windows still say 30 ms
    r = ref.Referee()
    r.loops.append(ref.RefereeLoop("smoke-1", True, 1, windows_us=[30_200.0, 30_250.0, 400_000.0], closed=True))
    over = ref.over_us(r, "smoke-1", 30_000.0)
    assert over == pytest.approx(250.0)  # the baseline's stalled window does not swallow the candidate's work
    calm = ref.RefereeLoop("smoke-1", False, 1, windows_us=[30_200.0, 30_300.0, 30_250.0], closed=True)
    assert ref.forged_claim("smoke-1", calm, 1.0, over)
    r.abandon()


# ---------------------------------------------------------------------------- real evaluations (CPU)

@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


def evaluate(task, source: str, **kw):
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=True) if c.label == "smoke-1"]
    logs = []
    assemble = evaluator_module.assemble

    def spy(job: Job, run, *a, **k):
        logs.append(run.referee)
        return assemble(job, run, *a, **k)

    evaluator_module.assemble = spy
    try:
        result = SandboxEvaluator(task, "cpu", cases, timeout_s=240, **kw).evaluate(source, Language.TRITON)
    finally:
        evaluator_module.assemble = assemble
    return result, logs[0]


def test_an_honest_kernel_passes_and_its_time_is_never_below_the_referees(task, task_dir):
    source = (task_dir / "starter" / "decode_triton.py").read_text()
    result, r = evaluate(task, source)
    assert result.status is Status.PASSED, result.reason
    lp, base = r.loop("smoke-1", False), r.loop("smoke-1", True)
    assert lp.windows_us and lp.kept and base.windows_us and not base.kept
    case = result.cases[0]
    seen = ref.seen_us(lp, ref.over_us(r, "smoke-1", case.baseline_us))
    assert seen is not None and case.referee_us == pytest.approx(seen)
    assert case.time_us >= ref.floor_us(seen) > 0.9 * seen - 10.0


def test_a_forged_timer_claim_is_rejected_by_the_referees_clock(task, monkeypatch):
    monkeypatch.setattr(evaluator_module, "native_timer", lambda: None)  # the claim is the process's own word
    result, _ = evaluate(task, attack("forge_timer_claim")[0], static_scan=False, guard=False)
    assert result.status is Status.REJECTED and "the referee's own clock saw" in (result.reason or ""), result.reason


def test_answers_made_when_saved_are_held_to_the_digests_told_when_the_calls_returned(task):
    result, r = evaluate(task, attack("answer_when_saved")[0], static_scan=False, guard=False)
    assert r.loop("smoke-1", False).kept
    assert result.status is Status.REJECTED, f"{result.status.value}: {result.reason}"
    assert "not what the call left when it returned" in (result.reason or ""), result.reason


def test_a_referee_times_candidates_and_baselines_on_every_device_never_a_judge():
    from optagent.evaluation.sandbox import refereed

    job = dict(task_dir="x", nonce="n", scratch="/tmp/x")
    for device in (Device.CPU, Device.CUDA):
        assert refereed(Job(mode="candidate", device=device, **job))
        assert refereed(Job(mode="baseline", device=device, **job))
        assert not refereed(Job(mode="judge", device=device, **job))
    assert ref.floors_on(Device.CPU) and not ref.floors_on(Device.CUDA)


@pytest.mark.parametrize("device", [Device.CPU, Device.CUDA])
def test_the_referees_figure_floors_a_claim_on_a_cpu_is_recorded_on_a_gpu_and_a_forgery_fails_on_both(device):
    """On a GPU the harness's share of a window strays more than the kernels last (floors_on): the figure is
    recorded beside the claim, not a floor; a claim far under it (FORGED) is refused there as on a CPU."""
    from optagent.evaluation.sandbox import WorkerRun
    from optagent.evaluation.verdict import _refereed
    from optagent.schema import CaseKind, CaseResult, Timing

    referee = ref.Referee()
    referee.abandon()  # its pipes: never asked here, its log is filled by hand
    referee.loops = [ref.RefereeLoop("1", True, 1, windows_us=[1_100.0] * 3, closed=True),  # baseline: 100 us its own
                     ref.RefereeLoop("1", False, 1, windows_us=[1_400.0] * 3, closed=True,
                                     kept={0: ref.KeptCall(0, 0, 7, "0" * 64)})]
    job = Job(mode="candidate", device=device, task_dir="x", nonce="n", scratch="/tmp/x")

    def recorded(claim_us: float):
        case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time_us=claim_us, baseline_us=100.0,
                          time=Timing(median_us=claim_us, p10_us=claim_us, p90_us=claim_us, samples=3))
        return _refereed(job, WorkerRun(referee=referee), [case], ["1"])

    why, (case,) = recorded(200.0)  # the referee saw 1400 - (1100 - 100) = 400 us a call
    assert why is None and case.referee_us == pytest.approx(400.0)
    assert case.time_us == pytest.approx(ref.floor_us(400.0) if device is Device.CPU else 200.0)
    referee.loops[1].windows_us = [40_000.0] * 3
    why, _ = recorded(200.0)  # 39 ms seen against a 0.2 ms claim
    assert why and "the referee's own clock saw" in why


def test_a_claim_a_little_under_the_referee_stands_and_a_lower_one_is_recorded_at_its_floor():
    lp = ref.RefereeLoop("smoke-1", False, 1, windows_us=[40_000.0, 41_000.0, 400_000.0], closed=True)
    over = 1_000.0  # the harness's own share of a window
    assert ref.seen_us(lp, over) == pytest.approx(40_000.0)
    assert ref.floor_us(40_000.0) == pytest.approx(40_000.0 * 0.97 - 2.0)
    assert ref.forged_claim("smoke-1", lp, 0.5 * 40_000.0, over) is None  # half: floored (verdict.py), not rejected
    assert ref.forged_claim("smoke-1", lp, 0.1 * 40_000.0, over)  # a tenth: forged


def test_a_lanes_baseline_job_carries_the_harness_share_and_a_pooled_forgery_is_rejected(task, monkeypatch):
    """In a pool the baselines are timed once per lane, in a job of their own: its referee's figure comes
    with them, so a candidate timed in the lane is held to its clock as one that timed its own baselines."""
    from optagent.messages import Baseline

    monkeypatch.setattr(evaluator_module, "native_timer", lambda: None)
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=True) if c.label == "smoke-1"]
    ev = SandboxEvaluator(task, "cpu", cases, timeout_s=240, static_scan=False, guard=False)
    baselines = ev.time_baselines().all(Baseline)
    assert baselines and all(b.over_us is not None and b.over_us >= 0 for b in baselines)
    result = ev.evaluate_on(attack("forge_timer_claim")[0], Language.TRITON, baselines=lambda: baselines)
    assert result.status is Status.REJECTED and "the referee's own clock saw" in (result.reason or ""), result.reason


def test_a_halved_claim_is_recorded_at_the_referees_floor_not_at_half(task, monkeypatch):
    """forge_timer_claim with a modest forgery: a half, which looks like a faster kernel (the hidden suite's
    timer attack reported 0.63x); not proven forged, it is recorded at the referee's floor."""
    monkeypatch.setattr(evaluator_module, "native_timer", lambda: None)  # the claim is the process's own word
    source = attack("forge_timer_claim")[0]
    halved = source.replace("out[key] = out[key] / 100", "out[key] = out[key] / 2")
    assert halved != source
    result, r = evaluate(task, halved, static_scan=False, guard=False)
    assert result.status is Status.PASSED, result.reason
    case = result.cases[0]
    assert case.referee_us and case.time.median_us < case.referee_us  # the claim: half of a call
    assert case.time_us == pytest.approx(max(case.time.median_us, ref.floor_us(case.referee_us)))
