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
from optagent.evaluation import native_build
from optagent.evaluation import referee as ref
from optagent.evaluation import referee_log as figures
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

    def call(self, n: int, call_s: float = 0.0, between_s: float = 0.0, digest: str = "ab" * 32) -> list[str]:
        """One timed call as the harness makes it: its marks around the call, then its digest told."""
        time.sleep(between_s)  # the harness's redraw and flush
        assert self.ask("T") == ["G"]
        time.sleep(call_s)
        assert self.ask("D") == ["G"]
        return self.ask(f"R {n} 0 {digest}")

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
    for call in range(8):  # the "call": 10 or 20 ms by the referee's clock, 30 ms between calls
        s, seed, keep, drop = h.call(call, call_s=0.01 * (call % 2 + 1), between_s=0.03)
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
    assert len(lp.calls_us) == 8 and 9_000 < lp.call_us < 40_000, lp.calls_us
    assert min(lp.calls_us) > 9_000 and len(lp.between_us) == 7 and 29_000 < lp.between_low_us < 60_000, lp.between_us


native_clock = pytest.mark.skipif(native_build.referee_clock() is None, reason="no C compiler: no native clock")


def told_rs(monkeypatch) -> list:
    """The R questions the referee's thread was handed, each with the clock's own answer (None: the thread's)."""
    seen, answer = [], ref.Referee._answer

    def spy(self, raw, window_us, told=None):
        if raw[:1] in (b"R", b"W"):
            seen.append(told)
        return answer(self, raw, window_us, told)
    monkeypatch.setattr(ref.Referee, "_answer", spy)
    return seen


@native_clock
@pytest.mark.parametrize("n_keep,kept_n", [(3, 3), (1, ref.MIN_KEEP), (99, ref.MAX_KEEP)])
def test_the_clock_answers_the_harness_r_itself_and_the_thread_files_the_same_kept_calls(monkeypatch, n_keep, kept_n):
    told = told_rs(monkeypatch)
    h = Harness()
    assert h.ask(f"B smoke-1 eager 1 {n_keep}") == ["G"]
    warm = [h.ask("W 0") for _ in range(3)]
    assert all(a[0] == "S" and a[2:] == ["0", "-1"] for a in warm)
    kept, seeds = set(), {int(a[1]) for a in warm}
    for call in range(60):
        s, seed, keep, drop = h.call(call)
        assert s == "S" and 0 <= int(seed) < 1 << ref.SEED_BITS
        seeds.add(int(seed))
        if keep == "1":
            kept.add(call)
        kept.discard(int(drop))
    assert h.ask("E") == ["G"] and h.ask("B smoke-1 baseline 1 3") == ["G"]
    base = [h.call(call) for call in range(5)]
    assert h.ask("E") == ["G"]
    r = h.close()
    assert r.violation is None and len(told) == 68 and all(t is not None for t in told)  # none waited for Python
    assert set(r.loop("smoke-1", False).kept) == kept and len(kept) == kept_n and len(seeds) == 63
    # each kept call's inputs: the seed its set was redrawn with just before it (the warm-up's, for the first)
    assert all(c.seed in seeds for c in r.loop("smoke-1", False).kept.values())
    assert all(a[2:] == ["0", "-1"] for a in base) and not r.loop("smoke-1", True).kept  # a baseline keeps none


@native_clock
def test_once_the_thread_refused_a_question_the_clock_answers_no_r_itself(monkeypatch):
    told = told_rs(monkeypatch)
    h = Harness()
    assert h.ask("B smoke-1 eager 1 3") == ["G"] and h.call(0)[0] == "S"
    assert h.ask("D") == ["G"]  # out of turn: the clock answers its marks at once; the thread refuses it
    h.referee._thread.join(5)
    assert h.ask("R 1 0 " + "ab" * 32) == []  # in the clock's own turn, yet not answered: the thread has refused
    r = h.close()
    assert "D where the harness says T" in (r.violation or "") and len(told) == 1


@pytest.mark.parametrize("questions,why", [
    (["R 0 0 " + "ab" * 32], "outside any timed loop"),
    (["B smoke-1 eager 1 3", "T", "D", "R 1 0 " + "ab" * 32], "out of order"),
    (["B smoke-1 eager 1 3", "T", "D", "R 0 5 " + "ab" * 32], "input set 5"),
    (["B smoke-1 eager 1 3", "T 0"], "never asks"),
    # a call not bracketed by the timer's marks: its window would hold the harness's work, or none of the call
    (["B smoke-1 eager 1 3", "R 0 0 " + "ab" * 32], "R where the harness says T"),
    (["B smoke-1 eager 1 3", "T", "R 0 0 " + "ab" * 32], "R where the harness says D"),
    (["B smoke-1 eager 1 3", "T", "T"], "T where the harness says D"),
    (["B smoke-1 eager 1 3", "T", "D", "E"], "left open"),
    (["B smoke-1 eager 1 3", "T", "D", "W 0"], "left open"),
    (["B smoke-1 eager 1 3", "B smoke-2 eager 1 3"], "inside another"),
    # two sets: the second's inputs, drawn a call ahead, could be answered in the first's window
    (["B smoke-1 eager 2 3"], "over 2 input sets"),
])
def test_a_question_out_of_turn_ends_the_answers(questions, why):
    h = Harness()
    answers = [h.ask(q) for q in questions]
    if answers[-1]:  # a mark out of turn: the native clock answered it, the next question finds the pipe closed
        assert questions[-1] in ref.MARKS and h.referee._relay is not None
        answers.append(h.ask("E"))
    assert answers[-1] == [] and all(answers[:-1])  # the pipe closed: the worker's harness cannot go on
    r = h.close()
    assert why in (r.violation or ""), r.violation
    assert why in (figures.unrefereed(r, ["smoke-1"]) or "")


def loop(calls_us: list[float], between_us: tuple = (), baseline: bool = False) -> ref.RefereeLoop:
    return ref.RefereeLoop("smoke-1", baseline, 1, calls_us=list(calls_us), between_us=list(between_us), closed=True)


CPU, GPU = Device.CPU, Device.CUDA


def test_a_claim_far_below_the_referees_clock_is_forged_and_no_time_is_recorded_below_it():
    lp = loop([110_000.0, 130_000.0])
    cal = figures.Calibration(20_000.0, None)
    assert figures.seen_us(lp, cal, CPU) == pytest.approx(90_000.0)
    assert figures.forged_claim("smoke-1", lp, 1_000.0, cal, CPU)  # a hundredth
    assert figures.forged_claim("smoke-1", lp, 95_000.0, cal, CPU) is None  # a median a little under the mean
    assert figures.forged_claim("smoke-1", lp, 1_000.0, None, CPU) is None  # not calibrated: no word


def test_a_stalled_window_neither_forges_an_honest_claim_nor_hides_a_forged_one():
    """A loaded host stalls a window now and then (seen in CI: 200 ms in a loop of 30 ms calls); the
    referee's median window holds against one, in the candidate's loop and in the baseline's alike."""
    stalled = loop([30_200.0, 600_000.0, 30_300.0])
    assert figures.forged_claim("smoke-1", stalled, 30_000.0, figures.Calibration(200.0, None), CPU) is None
    assert figures.forged_claim("smoke-1", stalled, 1.0, figures.Calibration(200.0, None), CPU)  # its calls still say 30 ms
    r = ref.Referee()
    r.loops.append(loop([30_200.0, 30_250.0, 400_000.0], baseline=True))
    cal = figures.own_calibration(r, {"smoke-1": 30_000.0})["smoke-1"]
    assert cal.call_over_us == pytest.approx(200.0)  # the baseline's stalled window does not swallow the candidate's
    assert figures.forged_claim("smoke-1", loop([30_200.0, 30_300.0, 30_250.0]), 1.0, cal, CPU)
    r.abandon()


def test_a_call_windows_overhead_is_the_cases_median():
    """One case's baseline claim can come from a retried loop its windows do not match (on the H200 a case's figure
    read 0 us): each case is held to the median overhead of all."""
    r = ref.Referee()
    r.loops += [loop([130.0] * 8, baseline=True), ref.RefereeLoop("2", True, 1, calls_us=[900.0] * 8, closed=True),
                ref.RefereeLoop("3", True, 1, calls_us=[230.0] * 8, closed=True)]
    cals = figures.own_calibration(r, {"smoke-1": 100.0, "2": 120.0, "3": 195.0})  # overheads 30, 780, 35
    assert {c.call_over_us for c in cals.values()} == {35.0}
    r.abandon()


def test_a_gpu_call_window_floors_what_a_forger_gains_to_its_resolution():
    """On a GPU a call's window holds the call and its sync alone (the redraw, flush and digest lie between
    calls): a claim of 0.63x (the hidden suite's) is recorded at the referee's floor, one of 0.5x is forged."""
    base = loop([130.0] * 20, baseline=True)
    r = ref.Referee()
    r.loops.append(base)
    cal = figures.own_calibration(r, {"smoke-1": 100.0})["smoke-1"]  # 30 us of the marks' round trips and the sync
    lp = loop([230.0, 231.0, 229.0, 400.0])  # a 200 us kernel, one window stalled (another process's time slice)
    assert figures.seen_us(lp, cal, GPU) == pytest.approx(200.0)
    assert figures.forged_claim("smoke-1", lp, 198.0, cal, GPU) is None
    assert figures.forged_claim("smoke-1", lp, 0.63 * 200, cal, GPU) is None  # floored by the verdict, not rejected
    assert figures.floor_us(200.0) > 0.95 * 200
    assert "the referee's own clock saw" in figures.forged_claim("smoke-1", lp, 0.5 * 200, cal, GPU)
    r.abandon()


def test_work_moved_between_the_calls_is_counted_past_the_harness_noise_and_a_call_left_empty_is_rejected():
    """The time between calls holds the harness's digest, redraw and flush: against a trusted loop's (its low
    decile), what is beyond MOVED_SLACK counts as the call's; most of a kernel there is work moved out."""
    cal = figures.Calibration(30.0, 1_000.0)  # the baseline's loop: 1 ms of the harness's own between calls
    share, us = figures.MOVED_SLACK[GPU]
    slack = max(share * 1_000.0, us)
    honest = loop([130.0] * 10, [1_000.0 + slack * 0.9] * 10)  # noise within the slack: nothing counted
    assert figures.moved_us(honest, cal, GPU) == 0.0 and figures.seen_us(honest, cal, GPU) == pytest.approx(100.0)
    some = loop([130.0] * 10, [1_000.0 + slack + 60.0] * 10)  # 60 us beyond it: counted as the call's
    assert figures.seen_us(some, cal, GPU) == pytest.approx(160.0)
    assert figures.forged_claim("smoke-1", some, 100.0, cal, GPU) is None
    moved = loop([32.0] * 10, [1_000.0 + slack + 100.0] * 10)  # the kernel's 100 us between the calls, none in them
    why = figures.forged_claim("smoke-1", moved, 2.0, cal, GPU)
    assert why and "moved out of the timed window" in why
    assert figures.moved_us(moved, figures.Calibration(30.0, None), GPU) == 0.0  # no trusted loop to hold it against


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
    assert lp.calls_us and lp.between_us and lp.kept and base.calls_us and base.between_us and not base.kept
    case = result.cases[0]
    seen = figures.seen_us(lp, figures.own_calibration(r, {"smoke-1": case.baseline_us})["smoke-1"], Device.CPU)
    assert seen is not None and case.referee_us == pytest.approx(seen)
    assert case.time_us >= figures.floor_us(seen) > 0.9 * seen - 10.0


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


@pytest.mark.parametrize("device", [Device.CPU, Device.CUDA])
def test_the_referees_figure_floors_the_recorded_time_and_a_forgery_fails_on_every_device(device):
    from optagent.evaluation.sandbox import WorkerRun
    from optagent.evaluation.verdict import _refereed
    from optagent.schema import CaseKind, CaseResult, Timing

    referee = ref.Referee()
    referee.abandon()  # its pipes: never asked here, its log is filled by hand
    referee.loops = [ref.RefereeLoop("1", True, 1, calls_us=[1_100.0] * 3, closed=True),  # baseline: 100 us its own
                     ref.RefereeLoop("1", False, 1, calls_us=[1_400.0] * 3, closed=True,
                                     kept={0: ref.KeptCall(0, 0, 7, "0" * 64)})]
    job = Job(mode="candidate", device=device, task_dir="x", nonce="n", scratch="/tmp/x")

    def recorded(claim_us: float):
        case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time_us=claim_us, baseline_us=100.0,
                          time=Timing(median_us=claim_us, p10_us=claim_us, p90_us=claim_us, samples=3))
        return _refereed(job, WorkerRun(referee=referee), [case], ["1"])

    why, (case,) = recorded(300.0)  # the referee saw 1400 - (1100 - 100) = 400 us a call
    assert why is None and case.referee_us == pytest.approx(400.0)
    assert case.time_us == pytest.approx(figures.floor_us(400.0))
    why, (case,) = recorded(450.0)  # a claim above the figure stands
    assert case.time_us == pytest.approx(450.0)
    referee.loops[1].calls_us = [40_000.0] * 3
    why, _ = recorded(200.0)  # 39 ms seen against a 0.2 ms claim
    assert why and "the referee's own clock saw" in why


def test_a_claim_a_little_under_the_referee_stands_and_a_lower_one_is_recorded_at_its_floor():
    lp = loop([40_000.0, 41_000.0, 400_000.0])
    cal = figures.Calibration(1_000.0, None)  # the harness's own share of a call's window
    assert figures.seen_us(lp, cal, CPU) == pytest.approx(39_000.0)  # three windows in four: 40 ms at least
    assert figures.floor_us(40_000.0) == pytest.approx(40_000.0 * 0.97 - 2.0)
    assert figures.forged_claim("smoke-1", lp, 0.5 * 40_000.0, cal, CPU) is None  # half: floored (verdict.py), not rejected
    assert figures.forged_claim("smoke-1", lp, 0.1 * 40_000.0, cal, CPU)  # a tenth: forged


def test_a_lanes_baseline_job_carries_the_harness_share_and_a_pooled_forgery_is_rejected(task, monkeypatch):
    """In a pool the baselines are timed once per lane, in a job of their own: its referee's figure comes
    with them, so a candidate timed in the lane is held to its clock as one that timed its own baselines."""
    from optagent.messages import Baseline

    monkeypatch.setattr(evaluator_module, "native_timer", lambda: None)
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=True) if c.label == "smoke-1"]
    ev = SandboxEvaluator(task, "cpu", cases, timeout_s=240, static_scan=False, guard=False)
    baselines = ev.time_baselines().all(Baseline)
    assert baselines and all(b.over_us is not None and b.over_us >= 0 and b.between_us for b in baselines)
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
    assert case.time_us == pytest.approx(max(case.time.median_us, figures.floor_us(case.referee_us)))


# ---------------------------------------------------------------------------- on the GPU (run on the device)

def gpu_evaluate(task, source: str, labels: str, **kw):
    cases = select_cases(task, "cuda", len(evaluator_module.probe_task(task).cases), labels, hidden=False)
    return SandboxEvaluator(task, "cuda", cases, timeout_s=300, **kw).evaluate(source, Language.TRITON)


@pytest.mark.gpu
def test_gpu_a_forged_claim_gains_at_most_the_referees_resolution_and_a_gross_one_is_rejected(task, monkeypatch):
    """What a kernel that reads the timer's secret from its own memory can tell the parent (the hidden suite's
    0.63x): the timer's figure scaled. On the H200 the referee's call windows hold it to its resolution, or, where
    they saw more than FORGED allows (the Python timer's own marks lengthen its windows), reject it."""
    monkeypatch.setattr(evaluator_module, "native_timer", lambda: None)  # the claim is the process's own word
    source = attack("forge_timer_claim")[0]
    scaled = source.replace("out[key] = out[key] / 100", "out[key] = out[key] * 0.63")
    assert scaled != source
    result = gpu_evaluate(task, scaled, "1,12", static_scan=False, guard=False)
    print(result.status.value, result.reason)
    if result.status is Status.REJECTED:  # the referee's clock saw more than 1.5x the claim: proven forged
        assert "the referee's own clock saw" in (result.reason or ""), result.reason
    else:
        assert result.status is Status.PASSED, result.reason
        for case in result.timed:
            print(f"case {case.case}: claim {case.time.median_us:.1f} us, referee {case.referee_us:.1f}, recorded "
                  f"{case.time_us:.1f}, baseline {case.baseline_us:.1f}")
            assert case.time_us >= figures.floor_us(case.referee_us) > 1.4 * case.time.median_us, case
    result = gpu_evaluate(task, source, "1", static_scan=False, guard=False)
    assert result.status is Status.REJECTED and "the referee's own clock saw" in (result.reason or ""), result.reason


@pytest.mark.gpu
def test_gpu_an_honest_kernel_is_recorded_at_its_own_time(task, task_dir):
    source = (task_dir / "starter" / "decode_triton.py").read_text()
    result = gpu_evaluate(task, source, "1,3,12")
    assert result.status is Status.PASSED, result.reason
    for case in result.timed:
        print(f"case {case.case}: claim {case.time.median_us:.1f} us, referee {case.referee_us:.1f}, recorded "
              f"{case.time_us:.1f}")
        assert case.referee_us and case.time_us == pytest.approx(case.time.median_us, rel=0.05), case


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["after_work_answer", "answer_when_saved"])
def test_gpu_work_moved_out_of_the_calls_or_after_them_fails(task, name):
    result = gpu_evaluate(task, attack(name)[0], "1,12", static_scan=False, guard=False)
    print(name, result.status.value, result.reason)
    assert result.status in (Status.REJECTED, Status.INCORRECT), result.reason


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_window_holds_all_the_worker_did_though_the_clock_lost_its_core():
    """The clock stamps an answer before it writes it: a worker woken by the answer can take the clock's core at
    once (here both have one core), and a stamp taken only when the clock ran again made the next window lose what
    the worker did meanwhile (a 5 ms after-work read ~0: on a loaded CPU the moved-work check then missed a kernel
    run between the calls). Late stamps only lengthen a window, which the low quantiles leave out."""
    if native_build.referee_clock() is None:
        pytest.skip("no native clock here (no C compiler)")
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # this thread, and the referee's threads started from it
    try:
        h = Harness()
        assert h.ask("B smoke-1 eager 1 3") == ["G"]
        for call in range(12):
            _spin(0.005)  # the harness's after-work: busy, as a redraw is
            assert h.ask("T") == ["G"]
            _spin(0.005)  # the call
            assert h.ask("D") == ["G"]
            assert h.ask(f"R {call} 0 {'ab' * 32}")[0] == "S"
        assert h.ask("E") == ["G"]
    finally:
        os.sched_setaffinity(0, cores)
    lp = h.close().loop("smoke-1", False)
    assert lp is not None and min(lp.calls_us) >= 4_900, lp.calls_us
    assert min(lp.between_us) >= 4_900, lp.between_us


def test_on_a_cpu_a_call_left_empty_is_rejected_whatever_noise_the_harness_gaps_allow():
    """A loaded host stretches the trusted loop's gaps (6 ms here): a kernel moved out whole (105 ms between calls,
    claims of microseconds) hid under the 100 ms of noise allowed; its emptied calls give it away. An honest kernel
    on such a host (gaps of 120 ms over calls of 50 ms) still passes."""
    cal = figures.Calibration(200.0, 6_000.0)
    moved = loop([215.0] * 3, [105_000.0] * 3)
    assert figures.moved_us(moved, cal, CPU) == 0.0  # within the noise allowed
    why = figures.forged_claim("smoke-1", moved, 5.0, cal, CPU)
    assert why and "moved out of the timed window" in why
    honest = loop([50_200.0] * 3, [120_000.0] * 3)
    assert figures.forged_claim("smoke-1", honest, 50_000.0, figures.Calibration(200.0, 1_000.0), CPU) is None
    half = loop([25_200.0] * 3, [80_000.0] * 3)  # half of it moved: within what a loaded host does, floored by seen_us
    assert figures.forged_claim("smoke-1", half, 25_000.0, figures.Calibration(200.0, 1_000.0), CPU) is None
