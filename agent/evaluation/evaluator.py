"""The sandboxed evaluator: one candidate in, one validated EvalResult out.

Worker processes per evaluation: the candidate process (untrusted) and, once it
has exited, the judge (trusted; two splitting the cases where judges.py says so).
Everything the candidate process says is a claim that the judge checks against
its own references.
"""

from __future__ import annotations

import hashlib
import importlib.util
import secrets
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional, Sequence

from optagent.cache import cache_root, write_json
from optagent.integrity import python_syntax_error, static_verdict
from optagent.secret_env import redact
from optagent.settings import settings
from optagent.worker.interpreter_faults import source_uses_dot, source_uses_fp8
from optagent.evaluation import isolation, referee, warm_worker
from optagent.evaluation.builds import Builds
from optagent.evaluation.cases import derived_smoke, select_cases
from optagent.evaluation.cost_clock import CostClock
from optagent.evaluation.judges import SIDE_BY_SIDE, Judges, JudgeService
from optagent.evaluation.gates import Control
from optagent.evaluation.lanes import Lane
from optagent.evaluation.limits import limits_for, record
from optagent.evaluation.native_build import native_timer
from optagent.evaluation.profiler import Profiler
from optagent.evaluation.sandbox import WorkerRun, run_worker
from optagent.evaluation.scratch import keep_scratch, new_scratch, remove_scratch, scratch_base, scratch_fd
from optagent.evaluation.verdict import assemble, timed_by_timer
from optagent.text import plain_tree
from optagent.messages import Baseline, CaseSpec, Done, Job, Probed, TimingSpec, WorkerError
from optagent.progress import Phase, PipeRelay, Progress, ProgressSink
from optagent.retries import once_more_if_killed
from optagent.schema import Device, EvalResult, Isolation, Language, Status, TimerKind
from optagent.task import TaskError, TaskPackage

TIMEOUT_S = 300.0  # seconds per worker process, unless --timeout says otherwise


def choose_cases(task: TaskPackage, device: Device, cases: Optional[str], hidden: bool = True) -> list[CaseSpec]:
    """select_cases, probing the package for its case count only when contest cases are wanted."""
    derive = device == Device.CPU and not cases and not (task.manifest and task.manifest.smoke)
    probed = probe_task(task, cached=True) if (cases or device == Device.CUDA or derive) else None
    n = len(probed.cases) if probed else 0
    return select_cases(task, device, n, cases, hidden, smallest=derived_smoke(probed) if derive and probed else None)


class SandboxEvaluator:
    def __init__(self, task: TaskPackage, device: Device, cases: list[CaseSpec], timeout_s: float = TIMEOUT_S,
                 compiler: Optional[list[str]] = None, keep_scratch: bool = False,
                 scratch_root: Optional[Path] = None, static_scan: bool = True, profile: bool = False,
                 guard: bool = True, target_facts: bool = False):
        self.task, self.device, self.cases = task, Device(device), cases
        self.timeout_s, self.compiler, self.keep, self.scratch_root = timeout_s, compiler, keep_scratch, scratch_root
        self.static_scan = static_scan  # off only in tests of the dynamic defences behind it
        self.guard = guard  # the in-process guard: off only in tests of the operating system's containment
        # CPU mode, for whoever reads compiler facts (a model, a user): Triton kernels also compiled for the
        # target GPU, a few seconds a candidate (worker/compiler_facts.py); the offline planner reads none
        self.target_facts = target_facts
        isolation.mechanism()  # a bad OPTAGENT_ISOLATION, or a forced mechanism that does not work, fails here
        limits_for(device)  # and so does a bad OPTAGENT_MEMORY_LIMIT_GIB
        self.profiler = Profiler.found() if profile else None  # and a bad OPTAGENT_NCU
        # one input set, redrawn after every call (on a CPU the referee's rule; on a GPU the L2 flush before each
        # call keeps caches honest, and each more set was drawn, kept and checked); on a CPU three timed calls, so
        # that the referee's median window outlasts a stalled one
        self.timing = (TimingSpec(input_sets=referee.ONE_SET, graphs=settings().graph_timing)
                       if self.device is Device.CUDA
                       else TimingSpec(min_iters=3, max_iters=3, budget_s=0.0, input_sets=referee.ONE_SET, warmup=1))
        # a pool's lane: a candidate's correctness runs and its judges hold it shared, never beside a timed phase
        # (evaluation/lanes.py); on a GPU, where their kernels would share the device with the timed calls
        self.shared_checks = self.device is Device.CUDA
        self.spares: Optional[warm_worker.Spares] = None  # candidate processes started ahead (keep_spares)
        self.judges: Optional[JudgeService] = None  # and judges that serve one evaluation after another
        self._judged = False  # no judge has run yet: the first runs alone (it measures the GPU's ceilings)
        self.builds = Builds(scratch_base(scratch_root) / "builds")  # passed kernels' own compiled code (builds.py)

    def keep_spares(self, per_device: int, lanes: Sequence[Lane] = ()) -> None:
        """A run's pool: candidate processes started before their candidates, per lane device (warm_worker.py);
        with OPTAGENT_SETTLE_S, each of `lanes` then holds its timed phases until the processes starting for it are
        warm (Lane.settle), at most that long."""
        if per_device > 0 and warm_worker.available(self.device) and self.spares is None:
            self.spares = warm_worker.Spares(lambda: self._job("candidate", *new_scratch(self.scratch_root), timer=native_timer()),
                                 self.timeout_s, per_device)
            # judges that serve evaluation after evaluation, as many as evaluations may ask for at once
            self.judges = JudgeService(lambda: self._job("judge", *new_scratch(self.scratch_root)), self.timeout_s,
                                       max(SIDE_BY_SIDE, per_device), [lane.device for lane in lanes] or [None],
                                       self.spares.track)
        wait_s = settings().settle_s  # none by default: on the H200 the wait cost more than the start-ups beside
        for lane in lanes if self.spares is not None and wait_s else ():
            lane.settle = partial(self.spares.settle, lane.device, wait_s)

    @staticmethod
    def _judge_job(job: Job) -> Job:
        return job.model_copy(update={"mode": "judge", "timer": None})

    def drop_spares(self) -> None:
        if self.spares is not None:
            self.spares.close()
            self.spares = None
        if self.judges is not None:
            self.judges.close()
            self.judges = None

    @property
    def planned_isolation(self) -> Isolation:
        """What the candidate process runs under: recorded in every verdict, 'none' included."""
        return record(isolation.describe(isolation.mechanism()), limits_for(self.device))

    def evaluate(self, source: str, language: Language, progress: Optional[ProgressSink] = None,
                 stop: Optional[threading.Event] = None) -> EvalResult:
        """progress hears each phase as it starts; stop, once set, ends it (its processes killed: gates.Stopped). A
        candidate process killed from outside is evaluated once more (a pool does it alone: evaluation/crowd.py)."""
        ends = Control(stop=stop) if stop is not None else None  # (a pool's evaluations: its gates and stop flag)
        return once_more_if_killed(lambda: self.evaluate_on(source, language, progress, gate=ends, control=ends))

    def evaluate_on(self, source: str, language: Language, progress: Optional[ProgressSink] = None, *,
                    gate: Optional[Control] = None, control: Optional[Control] = None,
                    baselines: Optional[Callable[[], list[Baseline]]] = None, judge: bool = True,
                    judges: Optional[int] = None) -> EvalResult:
        """evaluate, as a pool runs it: the candidate process behind `gate` (its lane) and the judge
        under `control` (the lane's device, the pool's stop flag); `baselines` gives its lane's
        baseline timings (evaluation/pool.py), which the candidate process then does not take.
        judge=False (a re-time): the candidate process times its cases only (Job.retime: no checked runs, nothing
        saved) and no judge runs; search/accept.py never lets such a timing beat a judged one. judges: how many
        judges at most (a pool says 1 for an evaluation that starts beside others: judges.py); None: SIDE_BY_SIDE."""
        start = time.monotonic()
        relay = PipeRelay(progress, self.cases) if progress else None
        sha = hashlib.sha256(source.encode()).hexdigest()
        timer = native_timer()  # built, or its sha256 checked, before every evaluation
        common = dict(language=language, device=self.device, source_sha256=sha, isolation=self.planned_isolation,
                      timer=TimerKind.NATIVE if timer else TimerKind.PYTHON)
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
        lane_device = gate.device if gate else None
        spare = self.spares.take(lane_device) if self.spares else None
        scratch, nonce = (spare.scratch, spare.nonce) if spare else new_scratch(self.scratch_root)
        clock = CostClock(started=start)
        early: Optional[Judges] = None
        try:
            src = scratch / f"candidate{language.ext}"
            src.write_text(source, encoding="utf-8")
            self.builds.lend(sha, scratch)  # this source's own compiled kernels, when it passed before
            (scratch / "outputs").mkdir()
            job = self._job("candidate", scratch, nonce, language=language, source_path=str(src),
                            outputs_dir=str(scratch / "outputs"), source_fp8=source_uses_fp8(source),
                            source_dot=source_uses_dot(source),
                            time_baseline=baselines is None, timer=timer, retime=not judge,
                            shared_checks=self.shared_checks)
            if progress:
                progress(Progress(phase=Phase.STARTING))
            wanted = (judges or SIDE_BY_SIDE) if self._judged else 1
            # a pool's judges serve evaluation after evaluation, leased once the candidate's process has ended
            # (_judge); without a pool, on a GPU, they start now, ready when the candidate ends
            if judge and self.judges is None and warm_worker.available(self.device):
                early = Judges(self._judge_job(job), wanted, self.timeout_s, control)
            heard = [f for f in (relay, clock, gate.on_message if gate else None) if f]
            on_message = lambda m: [f(m) for f in heard]  # noqa: E731
            run = (spare.run(job, [], on_message, gate or Control()) if spare else None) or \
                run_worker(job, self.timeout_s, on_message=on_message, control=gate)
            clock.worker_ended()
            if self.spares and judge:  # its timed phase is over: the next candidate's process starts (after a
                self.spares.top_up(lane_device)  # re-time's batch: pool.retime; not beside the next one's timing)
            clock.lane_wait_s = gate.waited_s() if gate else 0.0
            clock.timing_wait_s = gate.waited_in(Phase.TIMING) if gate else 0.0
            clock.case_wait_s = gate.waited_in(Phase.CASE) if gate else 0.0
            if baselines is not None:
                t0 = time.monotonic()
                run = replace(run, messages=[*baselines(), *run.messages])  # a second one told is a forgery
                clock.baseline_wait_s = time.monotonic() - t0

            def judged(jjob: Job) -> WorkerRun:
                t0 = time.monotonic()
                hold = gate.shared_hold("judges") if gate and self.shared_checks else nullcontext()
                try:
                    with hold:  # a judge killed from outside: once more (a dead one is not asked again: judges.py)
                        return once_more_if_killed(lambda: self._judge(jjob, relay, control, early, (lane_device, wanted)))
                finally:
                    clock.judge_s = time.monotonic() - t0
                    self._judged = True
            result = assemble(job, run, judged if judge else None, source_sha256=sha, timeout_s=self.timeout_s, started=start)
            if run.killed_from_outside and not result.status.ok:  # the host's doing or an operator's (crowd.py)
                result = result.model_copy(update={"killed_from_outside": True})
            if judge and result.status is Status.PASSED:
                self.builds.keep(sha, scratch_fd(scratch))
        finally:
            if early:
                early.abandon()  # unused (no case ran), or already collected
            (keep_scratch if self.keep else remove_scratch)(scratch)
        result = result.model_copy(update={"costs": clock.costs()})
        if self.profiler is not None and result.status is Status.PASSED:
            result = self._profiled(result, source, language, progress, gate, control)
        # A kernel that reads a secret and raises it would put it in a reason or the log; and what it
        # printed or raised is shown as plain text, no control character in it (text.plain).
        result = EvalResult.model_validate_json(redact(result.model_dump_json()))
        return EvalResult.model_validate(plain_tree(result.model_dump(mode="json")))

    def _profiled(self, result: EvalResult, source: str, language: Language, progress: Optional[ProgressSink],
                  gate: Optional[Control], control: Optional[Control]) -> EvalResult:
        """--profile: the passing result with ncu's reading of each case (evaluation/profiler.py)."""
        assert self.profiler is not None
        if progress:
            progress(Progress(phase=Phase.PROFILING))
        t0 = time.monotonic()
        result = self.profiler.attach(result, source, language, self._job, self.timeout_s, self.scratch_root,
                                      gate, control)
        spent = time.monotonic() - t0
        costs = result.costs.model_copy(update={"profile": spent}) if result.costs else None
        return result.model_copy(update={"costs": costs, "wall_s": result.wall_s + spent})

    def time_baselines(self, gate: Optional[Control] = None) -> WorkerRun:
        """The baseline job: the baselines alone, in a process with no candidate code, in `gate`'s lane,
        timed by the native timer as candidates are; its Baseline messages carry the timer's figures,
        and none at all when its records do not hold (the evaluations then say they have no baseline)."""
        scratch, nonce = new_scratch(self.scratch_root)
        try:
            job = self._job("baseline", scratch, nonce, timer=native_timer())
            run = run_worker(job, self.timeout_s, on_message=gate.on_message if gate else None, control=gate)
        finally:
            remove_scratch(scratch)
        return timed_by_timer(job, run)

    def _job(self, mode: str, scratch: Path, nonce: str, **fields) -> Job:
        # slow cases kept in the cache only where candidates cannot write it (a read-only file system)
        stored = isolation.describe(isolation.mechanism()).ro_fs
        return Job(mode=mode, task_dir=str(self.task.root), device=self.device, cases=self.cases,
                   seed=secrets.randbits(40), nonce=nonce, scratch=str(scratch), timing=self.timing,
                   compiler=self.compiler, guard=self.guard, target_facts=self.target_facts, stored_cases=stored, **fields)

    def _judge(self, job: Job, relay: Optional[PipeRelay], control: Optional[Control] = None,
               early: Optional[Judges] = None, lease: tuple[Optional[str], int] = (None, 1)) -> WorkerRun:
        """early: the judges' processes, started beside the candidate's (evaluation/judges.py); lease: the lane
        device and how many of the pool's serving judges (JudgeService) to take, where it keeps them."""
        if relay:
            relay.judging(job.cases)
        if early is None and self.judges is not None:
            leased = Judges.leased(self.judges, lease[1], lease[0], control)
            try:
                return leased.run(job, relay)
            finally:
                leased.abandon()  # given back to the service
        # none started beside the candidate (a CPU, Landlock): one started now, the same way (no warm process)
        return (early or Judges(job, 0, self.timeout_s, control)).run(job, relay)


def probe_task(task: TaskPackage, timeout_s: float = 600.0, cached: bool = False) -> Probed:
    """Import the package's testcase_config in a worker; raise TaskError on failure.

    With ``cached``, a probe of the same package files, interpreter and flash_attn
    availability is reused (evaluations only need the case count; validation always probes).
    """
    key = hashlib.sha256(f"{task.digest()}|{sys.executable}|{importlib.util.find_spec('flash_attn') is not None}"
                         .encode()).hexdigest()[:32]
    cache = cache_root() / "probe" / f"{key}.json"
    if cached and cache.exists():
        try:
            return Probed.model_validate_json(cache.read_text())
        except (OSError, ValueError):
            pass  # unreadable or of an older format: probe again
    def probe() -> WorkerRun:
        scratch, nonce = new_scratch()
        try:
            return run_worker(Job(mode="probe", task_dir=str(task.root), device=Device.CPU, nonce=nonce,
                                  scratch=str(scratch)), timeout_s)
        finally:
            remove_scratch(scratch)

    # killed from outside (seen twice on a loaded CI machine, a tiny package among them): the host's doing
    run = once_more_if_killed(probe)
    found = run.first(Probed)
    if found and run.first(Done):
        write_json(cache, found.model_dump(mode="json", exclude={"nonce"}))  # the nonce was spent with the run
        return found
    err = run.first(WorkerError)
    if err:
        text = err.error
        for path in filter(None, (task.config_path, task.hooks_path)):
            named = f"RuntimeError: {path}: "
            if text.startswith(named):  # the harness already named the file
                raise TaskError(path, text[len(named):])
        raise TaskError(task.config_path, f"loading failed: {text}")
    raise TaskError(task.config_path, f"probing {'timed out' if run.timed_out else run.limit or run.exit_text}")
