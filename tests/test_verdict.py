"""The verdict of an evaluation, assembled from canned worker messages: every path, no subprocess."""

from __future__ import annotations

import time
from typing import Optional

import pytest

from optagent.evaluation.sandbox import WorkerRun
from optagent.evaluation.verdict import assemble
from optagent.messages import (Baseline, CaseFailed, CaseRan, CaseSpec, CaseStart, Compiled, Done, Hello,
                               Integrity, Job, Message, Sample, Verdict, WorkerError)
from optagent.schema import CaseKind, EvalResult, GpuFacts, Language, Status, Timing

CASES = [CaseSpec(label="smoke-1", kind=CaseKind.SMOKE, params={}), CaseSpec(label="smoke-2", kind=CaseKind.SMOKE,
         params={}), CaseSpec(label="hidden-1", kind=CaseKind.HIDDEN, params={})]
SKIPPED = "not run: an earlier case failed"


def timing(us: float) -> Timing:
    return Timing(median_us=us, p10_us=0.9 * us, p90_us=1.1 * us, samples=5)


def job(device: str = "cpu") -> Job:
    return Job(mode="candidate", task_dir="/tasks/t", device=device, language=Language.TRITON,
               source_path="/scratch/candidate.py", cases=CASES, seed=7, nonce="n" * 32, scratch="/scratch")


def ran(case: str, us: Optional[float] = 50.0, gpu_us: Optional[float] = None) -> CaseRan:
    return CaseRan(case=case, samples=[Sample(name="given", file=f"/scratch/outputs/{case}-given.pt", sha256="0" * 64)],
                   load_ms=3.0, timing=timing(us) if us else None, gpu=timing(gpu_us) if gpu_us else None)


def up_to_cases() -> list[Message]:
    """What the candidate process says before its first case: hello, the baselines, the compile."""
    return [Hello(baseline_label="stand-in", device_name="cpu"),
            *(Baseline(case=c.label, timing=timing(100.0), sizes="2x16")
              for c in CASES if c.kind is not CaseKind.HIDDEN),
            Compiled(status=Status.PASSED)]


def all_ran(**times: float) -> list[Message]:
    """A clean run: every case started and ran (hidden ones untimed), then done."""
    out = up_to_cases()
    for c in CASES:
        out += [CaseStart(case=c.label), ran(c.label, None if c.kind is CaseKind.HIDDEN else times.get(c.label, 50.0))]
    return out + [Done()]


class Judge:
    """Stands in for the judge process: PASSED for every case unless told otherwise."""

    def __init__(self, *, verdicts: Optional[dict[str, Verdict]] = None, missing: tuple[str, ...] = (),
                 error: Optional[str] = None, returncode: int = 0):
        self.verdicts, self.missing, self.error, self.returncode = verdicts or {}, missing, error, returncode
        self.jobs: list[Job] = []

    def __call__(self, jjob: Job) -> WorkerRun:
        self.jobs.append(jjob)
        said: list[Message] = [self.verdicts.get(c.label) or Verdict(case=c.label, status=Status.PASSED, rel_err=1e-6,
                                                                      max_abs_err=1e-5, tolerance=1e-3)
                               for c in jjob.cases if c.label not in self.missing]
        said += [WorkerError(error=self.error)] if self.error else [Done()]
        return WorkerRun(said, returncode=self.returncode)


def evaluate(messages: list[Message], judge: Optional[Judge] = None, device: str = "cpu", **how) -> EvalResult:
    result = assemble(job(device), WorkerRun(messages, **how), judge or Judge(), source_sha256="ab" * 32,
                      timeout_s=60, started=time.monotonic())
    return EvalResult.model_validate_json(result.model_dump_json())  # what the store would read back


def statuses(result: EvalResult) -> dict[str, Status]:
    return {c.case: c.status for c in result.cases}


def test_all_passed_carries_times_baselines_and_the_judges_errors():
    judge = Judge()
    result = evaluate(all_ran(**{"smoke-1": 50.0, "smoke-2": 25.0}), judge)
    assert result.status is Status.PASSED and result.reason is None
    assert statuses(result) == {"smoke-1": Status.PASSED, "smoke-2": Status.PASSED, "hidden-1": Status.PASSED}
    one, two, hidden = result.cases
    assert (one.time_us, one.baseline_us, one.speedup, one.sizes, one.load_ms) == (50.0, 100.0, 2.0, "2x16", 3.0)
    assert two.speedup == 4.0 and result.geomean_speedup == pytest.approx(8 ** 0.5)
    assert hidden.time_us is None and hidden.baseline_us is None and hidden.kind is CaseKind.HIDDEN
    assert all(c.rel_err == 1e-6 and c.tolerance == 1e-3 and c.timing_kind == "cpu-interpreter" for c in result.cases)
    assert (result.baseline_label, result.device_name, result.language) == ("stand-in", "cpu", Language.TRITON)
    # the judge is asked once, about the cases that ran, with their samples and without the source
    (jjob,) = judge.jobs
    assert jjob.mode == "judge" and jjob.source_path is None
    assert [c.label for c in jjob.cases] == [c.label for c in CASES]
    assert jjob.samples["smoke-2"][0].file.endswith("smoke-2-given.pt") and jjob.nonce == job().nonce


def test_cuda_runs_carry_the_gpu_facts_and_graph_times():
    msgs = all_ran()
    msgs[0] = Hello(baseline_label="flash_attn", device_name="H100",
                    gpu=GpuFacts(name="H100", sm_count=132, l2_mb=50.0, bandwidth_gbs=3000.0))
    msgs[msgs.index(next(m for m in msgs if isinstance(m, CaseRan)))] = ran("smoke-1", 50.0, gpu_us=40.0)
    result = evaluate(msgs, device="cuda")
    told = {"name": "H100", "sm_count": 132, "l2_mb": 50.0, "bandwidth_gbs": 3000.0}
    assert result.status is Status.PASSED and {k: getattr(result.gpu, k) for k in told} == told
    assert result.cases[0].gpu_us == 40.0 and result.cases[0].timing_kind == "cuda"


@pytest.mark.parametrize("status", [Status.COMPILE_ERROR, Status.UNSUPPORTED, Status.REJECTED])
def test_a_kernel_that_does_not_prepare_has_no_cases_and_no_judge(status):
    judge = Judge()
    msgs = up_to_cases()[:-1] + [Compiled(status=status, reason="candidate.cu(3): error: expected an expression")]
    result = evaluate(msgs, judge, returncode=0)
    assert result.status is status and result.reason == "candidate.cu(3): error: expected an expression"
    assert result.cases == [] and judge.jobs == [] and result.baseline_label == "stand-in"


@pytest.mark.parametrize("extra, how, status, reason", [
    ([WorkerError(error="ImportError: no module named hooks")], dict(returncode=3), Status.RUNTIME_ERROR,
     "harness failed before the candidate was loaded: ImportError: no module named hooks"),
    ([], dict(returncode=-9, timed_out=True), Status.TIMEOUT, "the baseline did not finish within 60 s"),
    ([], dict(returncode=-9), Status.RUNTIME_ERROR, "worker killed by SIGKILL before the candidate was loaded"),
])
def test_a_worker_that_ends_before_the_compile(extra, how, status, reason):
    result = evaluate(up_to_cases()[:-1] + extra, **how)
    assert (result.status, result.reason, result.cases) == (status, reason, [])


@pytest.mark.parametrize("extra, reason", [
    ([ran("smoke-1")], "a second 'case' message"),
    ([CaseFailed(case="smoke-2", status=Status.INCORRECT, reason="x")], "a second 'case' message"),
    ([Done()], "a second 'done' message"),
    ([Hello(baseline_label="fast", device_name="cpu")], "a second 'hello' message"),
    ([Baseline(case="smoke-1", timing=timing(1e6), sizes="2x16")], "a second 'baseline' message"),
    ([Compiled(status=Status.PASSED)], "a second 'compile' message"),
])
def test_a_message_told_twice_rejects_the_run(extra, reason):
    msgs = all_ran()
    result = evaluate(msgs[:-1] + extra + msgs[-1:])
    assert result.status is Status.REJECTED and reason in result.reason and "forged results" in result.reason


def test_foreign_lines_reject_a_run_that_otherwise_passed():
    result = evaluate(all_ran(), foreign_lines=2)
    assert result.status is Status.REJECTED
    assert result.reason == "the result channel carried 2 line(s) not written by the harness (forged results)"
    assert all(c.status is Status.PASSED for c in result.cases)  # the cases stand; the run does not


def died_in_smoke_2() -> list[Message]:
    return up_to_cases() + [CaseStart(case="smoke-1"), ran("smoke-1"), CaseStart(case="smoke-2")]


def test_died_mid_case_names_the_signal_and_the_stderr_tail():
    judge = Judge()
    tail = "loading\n\nTraceback ...\nsegfault in kernel\nKilled\n"
    result = evaluate(died_in_smoke_2(), judge, returncode=-9, stderr_tail=tail)
    assert statuses(result) == {"smoke-1": Status.PASSED, "smoke-2": Status.RUNTIME_ERROR, "hidden-1": Status.SKIPPED}
    assert result.cases[1].reason == ("the candidate process killed by SIGKILL: "
                                      "Traceback ... | segfault in kernel | Killed")
    assert result.status is Status.RUNTIME_ERROR and result.reason == f"case smoke-2: {result.cases[1].reason}"
    assert result.cases[2].reason == SKIPPED and "Killed" in result.log_tail
    assert [c.label for c in judge.jobs[0].cases] == ["smoke-1"]  # only what ran is judged


@pytest.mark.parametrize("error, status", [
    ("InterpreterError: NameError: name 'undefined_name' is not defined", Status.COMPILE_ERROR),
    ("ValueError: no good", Status.RUNTIME_ERROR),
])
def test_an_exception_mid_case_is_its_reason(error, status):
    result = evaluate(died_in_smoke_2() + [WorkerError(error=error)], returncode=3)
    assert result.status is status and result.cases[1].reason == error and result.cases[2].status is Status.SKIPPED


def test_timed_out_mid_case():
    result = evaluate(died_in_smoke_2(), returncode=-9, timed_out=True)
    assert result.cases[1].status is Status.TIMEOUT
    assert result.reason == "case smoke-2: did not finish within the 60 s limit"


def test_exit_0_mid_case_is_rejected():
    result = evaluate(died_in_smoke_2(), returncode=0)
    assert result.status is Status.REJECTED and result.cases[1].status is Status.REJECTED
    assert "exited with code 0 in the middle of a case" in result.reason


def test_an_integrity_message_rejects_the_run_whatever_the_cases_say():
    msgs = all_ran()
    msgs.insert(-1, Integrity(reason="tried to import os at run time"))
    msgs.insert(-1, Integrity(reason="patched the harness's timers (time.perf_counter)"))
    result = evaluate(msgs)
    assert (result.status, result.reason) == (Status.REJECTED, "tried to import os at run time")


def test_the_judge_overrules_a_case_the_candidate_ran():
    wrong = Verdict(case="smoke-2", status=Status.INCORRECT, rel_err=0.5, max_abs_err=2.0, tolerance=1e-3,
                    reason="relative error 5.00e-01 exceeds 1.00e-03 (given inputs)")
    result = evaluate(all_ran(), Judge(verdicts={"smoke-2": wrong}))
    assert statuses(result) == {"smoke-1": Status.PASSED, "smoke-2": Status.INCORRECT, "hidden-1": Status.PASSED}
    assert result.status is Status.INCORRECT
    assert result.reason == "case smoke-2: relative error 5.00e-01 exceeds 1.00e-03 (given inputs)"
    assert (result.cases[1].rel_err, result.cases[1].max_abs_err) == (0.5, 2.0)
    assert result.geomean_speedup is None


@pytest.mark.parametrize("judge, why", [
    (Judge(missing=("hidden-1",), returncode=-11), "not judged: judge killed by SIGSEGV"),
    (Judge(missing=("hidden-1",), error="RuntimeError: CUDA out of memory", returncode=3),
     "not judged: RuntimeError: CUDA out of memory"),
])
def test_a_case_the_judge_never_spoke_of_is_a_runtime_error(judge, why):
    result = evaluate(all_ran(), judge)
    assert statuses(result)["hidden-1"] is Status.RUNTIME_ERROR and result.cases[2].reason == why
    assert result.status is Status.RUNTIME_ERROR and result.reason == f"case hidden-1: {why}"


@pytest.mark.parametrize("eager, graph, status", [
    (50.0, None, Status.REJECTED),  # 50 us < 0.9 x 80 us
    (75.0, None, Status.PASSED),  # within the margin
    (100.0, 60.0, Status.REJECTED),  # the CUDA-graph time counts too
])
def test_a_time_below_the_physical_floor_is_rejected(eager, graph, status):
    floor = Verdict(case="smoke-1", status=Status.PASSED, rel_err=1e-6, max_abs_err=1e-5, floor_us=80.0,
                    compute_floor_us=500.0)  # the compute floor may be beaten: it never rejects
    msgs = all_ran()
    msgs[next(i for i, m in enumerate(msgs) if isinstance(m, CaseRan))] = ran("smoke-1", eager, gpu_us=graph)
    result = evaluate(msgs, Judge(verdicts={"smoke-1": floor}), device="cuda")
    case = result.cases[0]
    assert case.status is status and (case.floor_us, case.compute_floor_us) == (80.0, 500.0)
    if status is Status.REJECTED:
        assert result.status is Status.REJECTED
        assert f"{min(x for x in (eager, graph) if x):.1f} us is below the physical floor of 80.0 us" in case.reason


def test_done_missing_rejects_a_run_whose_cases_all_passed():
    result = evaluate(all_ran()[:-1], returncode=0)
    assert all(c.status is Status.PASSED for c in result.cases)
    assert result.status is Status.REJECTED
    assert result.reason == "the candidate process exited with code 0 before the harness finished its checks"


def test_done_missing_does_not_hide_a_worse_failure():
    wrong = Verdict(case="smoke-1", status=Status.INCORRECT, reason="output #2 missing (given inputs)")
    result = evaluate(all_ran()[:-1], Judge(verdicts={"smoke-1": wrong}), returncode=0)
    assert result.status is Status.INCORRECT and result.reason == "case smoke-1: output #2 missing (given inputs)"


def test_cases_after_a_failure_are_skipped_even_if_messages_follow():
    judge = Judge()
    msgs = up_to_cases() + [CaseStart(case="smoke-1"),
                            CaseFailed(case="smoke-1", status=Status.REJECTED,
                                       reason="modified its input argument(s) [1] (inputs must stay read-only)"),
                            CaseStart(case="smoke-2"), ran("smoke-2")]
    result = evaluate(msgs, judge, returncode=0)
    assert statuses(result) == {"smoke-1": Status.REJECTED, "smoke-2": Status.SKIPPED, "hidden-1": Status.SKIPPED}
    assert all(c.reason == SKIPPED for c in result.cases[1:])
    assert result.status is Status.REJECTED and result.reason.startswith("case smoke-1: modified its input")
    assert judge.jobs == []  # nothing ran that counts


def test_a_case_never_started_is_skipped_not_failed():
    """The process stopped between cases (after smoke-1's message, before smoke-2 started)."""
    msgs = up_to_cases() + [CaseStart(case="smoke-1"), ran("smoke-1")]
    result = evaluate(msgs, returncode=0)
    assert statuses(result) == {"smoke-1": Status.PASSED, "smoke-2": Status.SKIPPED, "hidden-1": Status.SKIPPED}
    assert result.status is Status.SKIPPED and result.reason == f"case smoke-2: {SKIPPED}"


def untimed_run() -> list[Message]:
    """check() failed smoke-2's output in the candidate's process: it is said untimed, and nothing more is timed."""
    return up_to_cases() + [CaseStart(case="smoke-1"), CaseStart(case="smoke-2"),
                            CaseRan(case="smoke-2", samples=ran("smoke-2").samples, load_ms=3.0, untimed=True), Done()]


def test_a_case_check_failed_in_the_candidates_process_is_judged_untimed():
    wrong = Verdict(case="smoke-2", status=Status.INCORRECT, reason="the task's check() failed", rel_err=0.9)
    judge = Judge(verdicts={"smoke-2": wrong})
    result = evaluate(untimed_run(), judge)
    assert result.status is Status.INCORRECT and result.reason == "case smoke-2: the task's check() failed"
    assert [c.label for c in judge.jobs[0].cases] == ["smoke-2"]  # judged, with no timed call asked for
    first, second, hidden = result.cases
    assert (first.status, first.reason) == (Status.SKIPPED, "checked, not timed: case smoke-2 failed")
    assert second.time_us is None and hidden.status is Status.SKIPPED


def test_an_untimed_case_the_judge_passes_is_rejected():
    result = evaluate(untimed_run(), Judge())
    assert result.status is Status.REJECTED and "untimed" in result.reason, result.reason


def test_an_untimed_case_in_a_retime_is_incorrect():
    result = assemble(job(), WorkerRun(untimed_run()), None, source_sha256="ab" * 32, timeout_s=60,
                      started=time.monotonic())
    assert result.status is Status.INCORRECT and "check() failed" in result.reason
