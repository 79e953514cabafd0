"""The sandboxed evaluator: one candidate in, one validated EvalResult out.

Two worker processes per evaluation: the candidate process (untrusted) and,
after it has exited, the judge (trusted). Everything the candidate process
says is a claim that the judge checks against its own references.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Optional

from optagent.cache import cache_root, write_json
from optagent.evaluation.checks import python_syntax_error, redact, static_verdict
from optagent.worker.interpreter_faults import source_uses_fp8
from optagent.messages import CaseSpec, Job, TimingSpec
from optagent.progress import Phase, PipeRelay, Progress, ProgressSink
from optagent.evaluation import isolation
from optagent.evaluation.limits import limits_for, over_memory, record
from optagent.evaluation.sandbox import WorkerRun, keep_scratch, new_scratch, remove_scratch, run_worker
from optagent.schema import CaseKind, CaseResult, EvalResult, Isolation, Language, Status, Timing, worst
from optagent.task import TaskError, TaskPackage

# Triton compiles at the first call; under the CPU interpreter the same mistakes
# surface as an InterpreterError wrapping the Python error.
COMPILE_FAILURE = re.compile(r"CompilationError|CompileError|InterpreterError: (NameError|SyntaxError|"
                             r"AttributeError|TypeError|UnboundLocalError)")
# A time under 90% of the bytes/bandwidth floor is physically implausible. Only the memory
# floor is used so: the compute floor rests on the framework GEMM's measured rate, which a
# good kernel may beat.
FLOOR_MARGIN = 0.9


class CaseListError(ValueError):
    """A --cases value that names no valid case; the message is one line."""


def parse_case_list(text: str, n: int) -> list[int]:
    """'1,3-5' -> [1, 3, 4, 5], checked against the package's case count."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise CaseListError(f"--cases: {part!r} is not a case number or range")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi > n or lo > hi:
            raise CaseListError(f"--cases: {part!r} is outside 1-{n}")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def select_cases(task: TaskPackage, device: str, num_cases: int, cases: Optional[str],
                 hidden: bool = True) -> list[CaseSpec]:
    m = task.manifest
    if cases:
        chosen = [CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i) for i in parse_case_list(cases, num_cases)]
    elif device == "cpu":
        if not m or not m.smoke:
            raise TaskError(task.root, "no smoke cases for a CPU run: add [[smoke]] to optagent.toml or pass --cases")
        chosen = [CaseSpec(label=f"smoke-{k}", kind=CaseKind.SMOKE, params=p) for k, p in enumerate(m.smoke, 1)]
    else:
        chosen = [CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i) for i in range(1, num_cases + 1)]
    if hidden and m:
        chosen += [CaseSpec(label=f"hidden-{k}", kind=CaseKind.HIDDEN, params=p) for k, p in enumerate(m.hidden, 1)]
    return chosen


def choose_cases(task: TaskPackage, device: str, cases: Optional[str], hidden: bool = True) -> list[CaseSpec]:
    """select_cases, probing the package for its case count only when contest cases are wanted."""
    n = len(probe_task(task, cached=True)["cases"]) if (cases or device == "cuda") else 0
    return select_cases(task, device, n, cases, hidden)


def _first_per_case(messages: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for m in messages:
        out.setdefault(m["case"], m)
    return out


def _timing(d: Optional[dict]) -> Optional[Timing]:
    return Timing(**d) if d else None


class SandboxEvaluator:
    def __init__(self, task: TaskPackage, device: str, cases: list[CaseSpec], timeout_s: float = 300.0,
                 compiler: Optional[list[str]] = None, keep_scratch: bool = False,
                 scratch_root: Optional[Path] = None, static_scan: bool = True):
        self.task, self.device, self.cases = task, device, cases
        self.timeout_s, self.compiler, self.keep = timeout_s, compiler, keep_scratch
        self.scratch_root = scratch_root
        self.static_scan = static_scan  # off only in tests of the dynamic defences behind it
        isolation.mechanism()  # a bad OPTAGENT_ISOLATION, or a forced mechanism that does not work, fails here
        limits_for(device)  # and so does a bad OPTAGENT_MEMORY_LIMIT_GIB
        self.timing = TimingSpec() if device == "cuda" else TimingSpec(min_iters=2, max_iters=3, budget_s=0.0,
                                                                       input_sets=2, warmup=1)

    @property
    def planned_isolation(self) -> Isolation:
        """What the candidate process runs under: recorded in every verdict, 'none' included."""
        return record(isolation.describe(isolation.mechanism()), limits_for(self.device))

    def evaluate(self, source: str, language: Language, progress: Optional[ProgressSink] = None) -> EvalResult:
        """progress, when given, hears each phase of the evaluation as it starts."""
        start = time.monotonic()
        relay = PipeRelay(progress, self.cases) if progress else None
        sha = hashlib.sha256(source.encode()).hexdigest()
        common = dict(language=language, device=self.device, source_sha256=sha, isolation=self.planned_isolation)
        # A syntax error first: it is what is wrong, whatever else the scan would say of the text
        # (a file cut off before its @triton.jit "defines no kernel" too).
        bad = python_syntax_error(source) if language is not Language.CUDA else None
        if bad:
            return EvalResult(status=Status.COMPILE_ERROR, reason=bad, **common, cases=[],
                              wall_s=time.monotonic() - start)
        why = static_verdict(source, language) if self.static_scan else None
        if why:
            return EvalResult(status=Status.REJECTED, reason=f"rejected before running: {why}", **common,
                              cases=[], wall_s=time.monotonic() - start)
        scratch, nonce = new_scratch(self.scratch_root)
        try:
            suffix = ".cu" if language is Language.CUDA else ".py"
            src = scratch / f"candidate{suffix}"
            src.write_text(source, encoding="utf-8")
            (scratch / "outputs").mkdir()
            job = Job(mode="candidate", task_dir=str(self.task.root), device=self.device, language=language,
                      source_path=str(src), cases=self.cases, seed=secrets.randbits(40), nonce=nonce,
                      scratch=str(scratch), timing=self.timing, compiler=self.compiler,
                      outputs_dir=str(scratch / "outputs"), source_fp8=source_uses_fp8(source))
            if progress:
                progress(Progress(phase=Phase.STARTING))
            run = run_worker(job, self.timeout_s, on_message=relay)
            result = self._assemble(job, run, common, start, relay)
        finally:
            (keep_scratch if self.keep else remove_scratch)(scratch)
        # A kernel that reads a secret and raises it would put it in a reason or the log.
        return EvalResult.model_validate_json(redact(result.model_dump_json()))

    def _assemble(self, job: Job, run: WorkerRun, common: dict, start: float,
                  relay: Optional[PipeRelay] = None) -> EvalResult:
        hello = run.first("hello") or {}
        forged = self._forged(run)
        baselines = _first_per_case(run.all("baseline"))
        compiled = run.first("compile")
        error = run.first("error")
        tail = "\n".join(run.stderr_tail.strip().splitlines()[-15:]) or None
        extra = dict(device_name=hello.get("device_name"), baseline_label=hello.get("baseline_label"),
                     log_tail=tail, gpu=hello.get("gpu"))
        if compiled is None:
            if run.limit:
                reason = run.limit
            elif error:
                reason = f"harness failed before the candidate was loaded: {error['error']}"
            elif run.timed_out:
                reason = f"the baseline did not finish within {self.timeout_s:.0f} s"
            else:
                reason = f"worker {run.exit_text} before the candidate was loaded"
            status = Status.TIMEOUT if run.timed_out else Status.RUNTIME_ERROR
            return EvalResult(status=status, reason=reason, cases=[], wall_s=time.monotonic() - start,
                              **common, **extra)
        if compiled["status"] != "OK":
            return EvalResult(status=Status(compiled["status"]), reason=compiled["reason"], cases=[],
                              wall_s=time.monotonic() - start, **common, **extra)

        by_case = _first_per_case(run.all("case"))
        started = {m["case"] for m in run.all("case_start")}
        cases: list[CaseResult] = []
        ran: list[CaseSpec] = []
        stop = False
        for spec in job.cases:
            base = baselines.get(spec.label, {})
            row = dict(case=spec.label, kind=spec.kind, sizes=base.get("sizes"),
                       baseline=_timing(base.get("timing")),
                       timing_kind="cuda" if self.device == "cuda" else "cpu-interpreter")
            msg = by_case.get(spec.label)
            if stop or (msg is None and spec.label not in started):
                cases.append(CaseResult(status=Status.SKIPPED, reason="not run: an earlier case failed", **row))
                continue
            if msg is None:
                status, reason = self._died(run, error)
                cases.append(CaseResult(status=status, reason=reason, **row))
                stop = True
                continue
            if msg["status"] != "RAN":
                over = over_memory(msg["reason"] or "", run.isolation, self.device)  # e.g. at the module's import
                cases.append(CaseResult(status=Status.RUNTIME_ERROR if over else Status(msg["status"]),
                                        reason=over or msg["reason"], **row))
                stop = True
                continue
            t = _timing(msg.get("timing"))
            g = _timing(msg.get("gpu"))
            row.update(time=t, time_us=t.median_us if t else None, gpu_us=g.median_us if g else None,
                       baseline_us=row["baseline"].median_us if row["baseline"] else None,
                       load_ms=msg.get("load_ms"))
            cases.append(CaseResult(status=Status.PASSED, **row))
            ran.append(spec)
        if ran:
            cases = self._judge(job, run, ran, cases, relay)
        status = worst([c.status for c in cases]) if cases else Status.RUNTIME_ERROR
        reason = next((f"case {c.case}: {c.reason}" for c in cases if c.status is status and c.reason), None)
        integrity = run.all("integrity")
        if forged:
            status, reason = Status.REJECTED, forged
        elif integrity:
            status, reason = Status.REJECTED, integrity[0]["reason"]
        elif run.limit:
            status, reason = Status.RUNTIME_ERROR, run.limit
        elif run.first("done") is None and status is Status.PASSED:
            status = Status.REJECTED
            reason = f"the candidate process {run.exit_text} before the harness finished its checks"
        return EvalResult(status=status, reason=reason if status is not Status.PASSED else None, cases=cases,
                          wall_s=time.monotonic() - start, **common, **extra)

    @staticmethod
    def _forged(run: WorkerRun) -> Optional[str]:
        """Why the result channel cannot be trusted: lines not from the harness, or a case told twice."""
        if run.foreign_lines:
            return f"the result channel carried {run.foreign_lines} line(s) not written by the harness (forged results)"
        for kind in ("hello", "baseline", "compile", "case", "done"):
            keys = [m.get("case", kind) for m in run.all(kind)]
            if len(keys) != len(set(keys)):
                return f"the result channel carried a second {kind!r} message (forged results)"
        return None

    def _died(self, run: WorkerRun, error: Optional[dict]) -> tuple[Status, str]:
        if run.limit:
            return Status.RUNTIME_ERROR, run.limit
        if run.timed_out:
            return Status.TIMEOUT, f"did not finish within the {self.timeout_s:.0f} s limit"
        if run.returncode == 0 and not error:  # only candidate code ends the process "successfully" mid-case
            return Status.REJECTED, "the process exited with code 0 in the middle of a case (exit before the checks)"
        if error:
            text = error["error"]
            if COMPILE_FAILURE.search(text):
                return Status.COMPILE_ERROR, text[:600]
            return Status.RUNTIME_ERROR, over_memory(text, run.isolation, self.device) or text[:600]
        lines = [ln for ln in run.stderr_tail.strip().splitlines() if ln.strip()][-3:]
        return Status.RUNTIME_ERROR, f"the candidate process {run.exit_text}" + (f": {' | '.join(lines)[:400]}" if lines else "")

    def _judge(self, job: Job, run: WorkerRun, ran: list[CaseSpec], cases: list[CaseResult],
               relay: Optional[PipeRelay] = None) -> list[CaseResult]:
        samples = {m["case"]: m["samples"] for m in run.all("case") if m["status"] == "RAN"}
        jjob = job.model_copy(update={"mode": "judge", "cases": ran, "samples": samples, "source_path": None})
        if relay:
            relay.judging(ran)
        verdict_run = run_worker(jjob, self.timeout_s, on_message=relay)
        verdicts = {m["case"]: m for m in verdict_run.all("verdict")}
        failure = verdict_run.first("error")
        out = []
        for c in cases:
            if c.status is not Status.PASSED:
                out.append(c)
                continue
            v = verdicts.get(c.case)
            if v is None:
                why = verdict_run.limit or (failure["error"] if failure else f"judge {verdict_run.exit_text}")
                out.append(c.model_copy(update={"status": Status.RUNTIME_ERROR, "reason": f"not judged: {why}"}))
                continue
            upd = {k: v.get(k) for k in ("rel_err", "max_abs_err", "tolerance", "floor_us", "compute_floor_us")}
            if v["status"] != "PASSED":
                upd.update(status=Status(v["status"]), reason=v["reason"])
            else:
                fastest = min(x for x in (c.time_us, c.gpu_us) if x) if (c.time_us or c.gpu_us) else None
                floor = v.get("floor_us")
                if floor and fastest and fastest < FLOOR_MARGIN * floor:
                    upd.update(status=Status.REJECTED, reason=f"{fastest:.1f} us is below the physical floor of "
                               f"{floor:.1f} us (bytes / measured bandwidth): work skipped or moved off the timed path")
            out.append(CaseResult.model_validate({**c.model_dump(), **upd}))
        return out


def probe_task(task: TaskPackage, timeout_s: float = 600.0, cached: bool = False) -> dict:
    """Import the package's testcase_config in a worker; raise TaskError on failure.

    With ``cached``, a probe of the same package files, interpreter and flash_attn
    availability is reused (evaluations only need the case count; validation always probes).
    """
    key = hashlib.sha256(f"{task.digest()}|{sys.executable}|{importlib.util.find_spec('flash_attn') is not None}"
                         .encode()).hexdigest()[:32]
    cache = cache_root() / "probe" / f"{key}.json"
    if cached and cache.exists():
        return json.loads(cache.read_text())
    scratch, nonce = new_scratch()
    try:
        job = Job(mode="probe", task_dir=str(task.root), device="cpu", nonce=nonce, scratch=str(scratch))
        run = run_worker(job, timeout_s)
    finally:
        remove_scratch(scratch)
    found = run.first("probe")
    if found and run.first("done"):
        write_json(cache, found)
        return found
    err = run.first("error")
    if err:
        text = err["error"]
        path = task.config_path
        named = f"RuntimeError: {path}: "
        if text.startswith(named):  # the harness already named the file
            raise TaskError(path, text[len(named):])
        raise TaskError(path, f"loading failed: {text}")
    raise TaskError(task.config_path, f"probing {'timed out' if run.timed_out else run.exit_text}")
