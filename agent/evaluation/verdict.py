"""One evaluation's verdict, assembled from what its worker processes said.

Pure: the candidate process's run comes in with a callable that runs the judge on
the cases that ran, and an EvalResult goes out. Nothing here starts a process, so
every path (forged channel, death mid-case, the judge disagreeing) is tested with
canned messages (tests/test_verdict.py).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Callable, Optional, TypeVar, Union

from optagent.evaluation import referee_log
from optagent.evaluation.limits import over_memory
from optagent.evaluation.sandbox import WorkerRun
from optagent.evaluation.timer_check import Checked, check_records, with_timings
from optagent.messages import (Baseline, CaseFailed, CaseRan, CaseSpec, CaseStart, Compiled, Done, Hello, Integrity,
                               Job, LaneReleased, LaneWanted, PhaseStarted, Verdict, WorkerError)
from optagent.schema import CaseKind, CaseResult, Device, EvalResult, FloorKind, Isolation, Status, TimerKind, worst
from optagent.timer_records import LoopKind, expected_checked, parse_reports

# Triton compiles at the first call; under the CPU interpreter the same mistakes
# surface as an InterpreterError wrapping the Python error.
COMPILE_FAILURE = re.compile(r"CompilationError|CompileError|InterpreterError: (NameError|SyntaxError|"
                             r"AttributeError|TypeError|UnboundLocalError)")
# A time under 90% of the bytes/bandwidth floor is physically implausible. Only the memory floor is used
# so: the compute floor rests on the framework GEMM's measured rate, which a good kernel may beat.
FLOOR_MARGIN = 0.9
# Each of these is told once per run (per case where it names one): a second is not the harness's.
# Lane messages once per phase: a forged release would let a neighbour time beside this process.
ONCE = (("hello", Hello), ("baseline", Baseline), ("compile", Compiled), ("case", (CaseRan, CaseFailed)),
        ("done", Done), ("lane_wanted", LaneWanted), ("lane_released", LaneReleased))

# A frame of the candidate's own file (the backends copy it to candidate_<n>_<case>.py; the harness
# module is candidate.py, without the underscore).
CANDIDATE_FRAME = re.compile(r'File "[^"]*/candidate_[^"/]*\.(?:py|cu)", line (\d+)')
CHAINED = re.compile(r"\n(?:The above exception was the direct cause of the following exception:|"
                     r"During handling of the above exception, another exception occurred:)\n")

JudgeRunner = Callable[[Job], WorkerRun]  # runs the judge's job, returns what the judge said
C = TypeVar("C", CaseRan, CaseFailed, Baseline)


def first_per_case(messages: list[C]) -> dict[str, C]:
    out: dict[str, C] = {}
    for m in messages:
        out.setdefault(m.case, m)
    return out


def forged(run: WorkerRun) -> Optional[str]:
    """Why the result channel cannot be trusted: lines not from the harness, or a message told twice."""
    if run.foreign_lines:
        return f"the result channel carried {run.foreign_lines} line(s) not written by the harness (forged results)"
    for name, kinds in ONCE:
        keys = [getattr(m, "case", getattr(m, "phase", name)) for m in run.all(kinds)]
        if len(keys) != len(set(keys)):
            return f"the result channel carried a second {name!r} message (forged results)"
    return None


def died(run: WorkerRun, error: Optional[WorkerError], timeout_s: float,
         device: Device = Device.CPU) -> tuple[Status, str]:
    """The status of a case the candidate process started and never finished."""
    if run.limit:  # the parent stopped it at a limit (memory, tasks, output)
        return Status.RUNTIME_ERROR, run.limit
    if run.timed_out:
        return Status.TIMEOUT, f"did not finish within the {timeout_s:.0f} s limit"
    if run.returncode == 0 and not error:  # only candidate code ends the process "successfully" mid-case
        return Status.REJECTED, "the process exited with code 0 in the middle of a case (exit before the checks)"
    if error:
        line = candidate_line(error.traceback)
        where = f" (line {line})" if line and f"(line {line})" not in error.error else ""
        if COMPILE_FAILURE.search(error.error):  # Triton's message quotes the jit function: kept longer
            return Status.COMPILE_ERROR, error.error[:1500] + where
        return Status.RUNTIME_ERROR, over_memory(error.error, run.isolation, device) or error.error[:600] + where
    lines = [ln for ln in run.stderr_tail.strip().splitlines() if ln.strip()][-3:]
    said = f": {' | '.join(lines)[:400]}" if lines else ""
    return Status.RUNTIME_ERROR, f"the candidate process {run.exit_text}{said}"


def candidate_line(traceback: str) -> Optional[int]:
    """The innermost line of the candidate's file in the root cause of a traceback, or None.

    A chained traceback prints the cause first: Triton's interpreter wraps the kernel's own
    NameError in an InterpreterError raised from the launch, whose frames name the launch line."""
    for section in CHAINED.split(traceback or ""):
        lines = CANDIDATE_FRAME.findall(section)
        if lines:
            return int(lines[-1])
    return None


def assemble(job: Job, run: WorkerRun, judge: Optional[JudgeRunner], *, source_sha256: str, timeout_s: float,
             started: float, isolation: Optional[Isolation] = None) -> EvalResult:
    """The EvalResult of a candidate run: its claims per case, checked by the judge (run only when a case ran;
    never when ``judge`` is None: a re-time, whose timings the timer's records and the limits still check).

    ``isolation``: what the candidate process ran under, recorded in the verdict (the run's own by default)."""
    hello = run.first(Hello)
    tail = "\n".join(run.stderr_tail.strip().splitlines()[-15:]) or None
    common = dict(language=job.language, device=job.device, source_sha256=source_sha256, log_tail=tail,
                  isolation=isolation or run.isolation, timer=TimerKind.NATIVE if job.timer else TimerKind.PYTHON,
                  device_name=hello.device_name if hello else None,
                  baseline_label=hello.baseline_label if hello else None,
                  gpu=hello.gpu if hello else None)

    def result(status: Status, reason: Optional[str], cases: list[CaseResult]) -> EvalResult:
        return EvalResult(status=status, reason=reason, cases=cases, wall_s=time.monotonic() - started, **common)

    compiled = run.first(Compiled)
    error = run.first(WorkerError)
    if compiled is None:
        if run.limit:
            reason = run.limit
        elif error:
            reason = f"harness failed before the candidate was loaded: {error.error}"
        elif run.timed_out:
            reason = f"the baseline did not finish within {timeout_s:.0f} s"
        else:
            reason = f"worker {run.exit_text} before the candidate was loaded"
        return result(Status.TIMEOUT if run.timed_out else Status.RUNTIME_ERROR, reason, [])
    if compiled.status is not Status.PASSED:
        return result(compiled.status, compiled.reason, [])

    cases, ran = _claimed(job, run, error, timeout_s)
    timer = _timer_records(job, run)
    if timer.timings:
        cases = with_timings(cases, timer.timings)
    expected = expected_checked(job)
    untimed = {m.case for m in run.all(CaseRan) if m.untimed}  # check() failed them in the candidate's process
    timed = [c.case for c in cases if c.status is Status.PASSED and c.kind is not CaseKind.HIDDEN
             and c.case not in untimed]
    refereed, cases = _refereed(job, run, cases, timed)
    calls = referee_log.expected_calls(job, run.referee, timed) if run.referee else timer.expected
    for label, more in calls.items():
        expected[label] = expected.get(label, []) + more + (timer.graph_expected.get(label, []) if run.referee else [])
    if ran and not timer.reason and not refereed and judge is not None:
        cases = _judged(job, run, ran, cases, judge, expected)
    contradicted = next((c.case for c in cases if c.case in untimed and c.status is Status.PASSED and judge), None)
    status = worst([c.status for c in cases]) if cases else Status.RUNTIME_ERROR
    reason = next((f"case {c.case}: {c.reason}" for c in cases if c.status is status and c.reason), None)
    integrity = run.first(Integrity)
    why_forged = forged(run)
    if why_forged:
        status, reason = Status.REJECTED, why_forged
    elif timer.reason:
        status, reason = Status.REJECTED, timer.reason
    elif refereed:
        status, reason = Status.REJECTED, refereed
    elif contradicted:
        status, reason = Status.REJECTED, f"case {contradicted}: failed check() in its own process (untimed), not the judge's"
    elif untimed and judge is None:  # a re-time: no judge to say otherwise
        status, reason = Status.INCORRECT, f"case {min(untimed)}: the task's check() failed its output"
    elif integrity:
        status, reason = Status.REJECTED, integrity.reason
    elif timer.moved and status is Status.PASSED:
        status, reason = Status.REJECTED, timer.moved
    elif run.limit:
        status, reason = Status.RUNTIME_ERROR, run.limit
    elif run.first(Done) is None and status is Status.PASSED:
        status = Status.REJECTED
        reason = f"the candidate process {run.exit_text} before the harness finished its checks"
    return result(status, reason if status is not Status.PASSED else None, cases)


def _refereed(job: Job, run: WorkerRun, cases: list[CaseResult],
              timed: list[str]) -> tuple[Optional[str], list[CaseResult]]:
    """Why the referee's log contradicts the timed cases (evaluation/referee_log.py), or None; and the cases with
    no recorded time below the referee's. Without a referee: None, and the cases as they are."""
    if run.referee is None:
        return None, cases
    why = referee_log.unrefereed(run.referee, timed)
    if why:
        return why, cases
    cals = (referee_log.own_calibration(run.referee, {c.case: c.baseline_us for c in cases}) if job.time_baseline
            else referee_log.lane_calibration(first_per_case(run.all(Baseline))))
    out = []
    for c in cases:
        lp = run.referee.loop(c.case, False)
        if c.case not in timed or lp is None or c.time_us is None or c.time is None:
            out.append(c)
            continue
        cal = cals.get(c.case)
        why = referee_log.forged_claim(c.case, lp, c.time_us, cal, job.device)
        if why:
            return why, cases
        seen = referee_log.seen_us(lp, cal, job.device)
        if seen is not None:  # its figure less its resolution is the floor of what is recorded (c.time: the timer's)
            c = c.model_copy(update={"referee_us": seen, "time_us": max(c.time_us, referee_log.floor_us(seen))})
        out.append(c)
    return None, out


def _last_named(run: WorkerRun) -> Optional[str]:
    """The case the candidate process was on when it stopped (the last it named): all are checked before any is
    timed, so a case checked earlier has no outcome yet when a later one fails, and takes no blame for it."""
    named = [m.case for m in run.all((CaseStart, PhaseStarted, CaseFailed)) if m.case]
    return named[-1] if named else None


def _claimed(job: Job, run: WorkerRun, error: Optional[WorkerError],
             timeout_s: float) -> tuple[list[CaseResult], list[CaseSpec]]:
    """Each case as the candidate process tells it (PASSED for one that ran), and the cases that ran."""
    baselines = first_per_case(run.all(Baseline))
    outcomes: dict[str, Union[CaseRan, CaseFailed]] = first_per_case(run.all((CaseRan, CaseFailed)))
    started = {m.case for m in run.all(CaseStart)}
    failing = _last_named(run)
    cases: list[CaseResult] = []
    ran: list[CaseSpec] = []
    stop = False
    for spec in job.cases:
        base = baselines.get(spec.label)
        row = dict(case=spec.label, kind=spec.kind, sizes=base.sizes if base else None,
                   baseline=base.timing if base else None,
                   timing_kind="cuda" if job.device is Device.CUDA else "cpu-interpreter")
        msg = outcomes.get(spec.label)
        if stop or (msg is None and spec.label not in started):
            cases.append(CaseResult(status=Status.SKIPPED, reason="not run: an earlier case failed", **row))
        elif msg is None and failing not in (None, spec.label):  # checked, waiting to be timed: not its fault
            cases.append(CaseResult(status=Status.SKIPPED, reason=f"checked, not timed: case {failing} failed", **row))
        elif msg is None:
            status, reason = died(run, error, timeout_s, job.device)
            cases.append(CaseResult(status=status, reason=reason, **row))
            stop = True
        elif isinstance(msg, CaseFailed):
            over = over_memory(msg.reason or "", run.isolation, job.device)  # e.g. at the module's import
            cases.append(CaseResult(status=Status.RUNTIME_ERROR if over else msg.status, reason=over or msg.reason,
                                    kernels=msg.kernels, **row))
            stop = True
        else:
            t, g = msg.timing, msg.gpu
            cases.append(CaseResult(status=Status.PASSED, time=t, time_us=t.median_us if t else None,
                                    gpu_us=g.median_us if g else None, kernels=msg.kernels,
                                    baseline_us=base.timing.median_us if base else None, load_ms=msg.load_ms, **row))
            ran.append(spec)
    return cases, ran


def timed_by_timer(job: Job, run: WorkerRun) -> WorkerRun:
    """A baseline job's run with its Baseline timings taken from the native timer's records (without
    its records, or with records that do not hold, it keeps no Baseline at all), each with the harness's
    own time under the referee (referee_log.lane_calibration), where one answered."""
    timings: dict = {}
    if job.timer is not None:
        checked = _timer_records(job, run)
        if checked.reason:
            return replace(run, messages=[m for m in run.messages if not isinstance(m, Baseline)])
        timings = checked.timings

    def timed(m: Baseline) -> Baseline:
        timing = timings.get((m.case, LoopKind.BASELINE), m.timing)
        over, between = referee_log.case_figures(run.referee, m.case, timing.median_us)
        return m.model_copy(update={"timing": timing, "over_us": over, "between_us": between})
    return replace(run, messages=[timed(m) if isinstance(m, Baseline) else m for m in run.messages])


def _timer_records(job: Job, run: WorkerRun) -> Checked:
    """The native timer's word on the timings (nothing to say under the Python timer)."""
    if job.timer is None:
        return Checked()
    records, foreign = parse_reports(run.timer_lines, run.timer_secret or b"")
    return check_records(job, records, foreign, run.all(Baseline), run.all(CaseRan))


def _judged(job: Job, run: WorkerRun, ran: list[CaseSpec], cases: list[CaseResult],
            judge: JudgeRunner, expected: dict) -> list[CaseResult]:
    samples = {m.case: m.samples for m in run.all(CaseRan)}
    labels = {c.label for c in ran}
    verdict_run = judge(job.model_copy(update={"mode": "judge", "cases": ran, "samples": samples, "timer": None,
                                               "source_path": None,
                                               "expected": {k: v for k, v in expected.items() if k in labels}}))
    verdicts = {m.case: m for m in verdict_run.all(Verdict)}
    failure = verdict_run.first(WorkerError)
    out = []
    for c in cases:
        if c.status is not Status.PASSED:
            out.append(c)
            continue
        v = verdicts.get(c.case)
        if v is None:
            why = verdict_run.limit or (failure.error if failure else f"judge {verdict_run.exit_text}")
            out.append(c.model_copy(update={"status": Status.RUNTIME_ERROR, "reason": f"not judged: {why}"}))
            continue
        upd: dict = v.model_dump(include={"rel_err", "max_abs_err", "tolerance", "floor_us", "floor_kind",
                                              "compute_floor_us"})
        if v.status is not Status.PASSED:
            upd.update(status=v.status, reason=v.reason)
        else:
            fastest = min(x for x in (c.time_us, c.gpu_us) if x) if (c.time_us or c.gpu_us) else None
            # an estimated floor counts whole tensors, which a correct kernel need not all read: no proof
            floor = v.floor_us if v.floor_kind is not FloorKind.ESTIMATE else None
            if floor and fastest and fastest < FLOOR_MARGIN * floor:
                upd.update(status=Status.REJECTED, reason=f"{fastest:.1f} us is below the physical floor of "
                           f"{floor:.1f} us (bytes / measured bandwidth): work skipped or moved off the timed path")
        out.append(CaseResult.model_validate({**c.model_dump(), **upd}))
    return out
