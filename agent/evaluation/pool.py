"""The local evaluation pool: a round's candidates evaluated at once, timed one lane per GPU.

Each evaluation is today's (evaluator.py): a sandboxed candidate process, then the judge, driven by a thread of
the pool. Up to `jobs` run at once, so one's compiling and checking (CPU work) overlaps another's; their timed
phases wait for their lane (lanes.py), one per visible GPU, each process pinned to its lane's GPU. On the CPU there
is one lane by default (CPU times are labels, not rankings: OPTAGENT_CPU_LANES makes more, for tests).

The baselines are timed once per lane, in a process of their own (the baseline job: no
candidate code in it, as before when they were timed first in the candidate process) and
reused by every evaluation on that lane until the host drifts: the parent's host-speed
probe (worker/host_speed.py) runs more than SLACK off its speed at the baseline's time, or the
baseline was itself taken on a slow host, once it is MIN_AGE_S old; or it is MAX_AGE_S old. Why: the lane is the
shared resource, and the baselines took a quarter to a third of a candidate's time in it
(CPU, measured: 0.34 s of 1.34 s); and candidates timed on one lane now share one baseline
timing, so their speedups compare as their times do.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

from optagent import waits
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation import host_memory, take_down
from optagent.evaluation.crowd import ALONE_TOO, Crowd, again_alone
from optagent.evaluation.gpus import visible_gpus
from optagent.evaluation.gates import Control, Gate
from optagent.evaluation.lanes import Lane, OrderedLane
from optagent.messages import Baseline, Done
from optagent.progress import ProgressSink, serialised, stamped
from optagent.protocols import PoolJob
from optagent.retries import once_more_alone
from optagent.schema import Device, EvalResult
from optagent.settings import settings
from optagent.worker import host_speed

MAX_AGE_S = 900.0  # GPU clocks and neighbours drift in ways the host probe does not see
# A baseline job holds the lane for seconds (3-7 s on the H200 for decode), and the host probe drifts with whatever
# else the host does (other evaluations compiling, spare processes starting): on the H200 it ran again before nearly
# every evaluation (3 baseline jobs for 2 evaluations and a re-time). Drift re-times it at most once in this long.
MIN_AGE_S = 60.0
PROBES = 50  # the parent's host probe: the fastest of this many ~10 us runs


def default_jobs(lanes: int) -> int:
    """Evaluations at once: two processes a lane keep each lane busy while others compile (a
    candidate spends most of its time outside the lane), bounded by half the cores (torch's
    import and Triton's compiler are CPU work) and never below 2, so a round overlaps."""
    return max(2, min(2 * lanes + 2, (os.cpu_count() or 2) // 2))


def lane_devices(device: Device) -> list[Optional[str]]:
    if device is Device.CUDA:
        return list(visible_gpus()) or [None]  # None: whatever the process sees
    n = settings().cpu_lanes
    return [None] * max(1, int(n or 1))


@dataclass
class LaneBaseline:
    baselines: list[Baseline]
    probe_us: float
    at: float
    slow: bool  # taken while the host ran slow


class LocalPool:
    def __init__(self, evaluator: SandboxEvaluator, jobs: Optional[int] = None,
                 devices: Optional[list[Optional[str]]] = None):
        """devices: one a lane (a CUDA_VISIBLE_DEVICES entry, or None); default lane_devices()."""
        devices = devices if devices is not None else lane_devices(evaluator.device)
        self.evaluator = evaluator
        self.lane_list = [Lane(i, d) for i, d in enumerate(devices)]
        self.lanes = len(self.lane_list)
        self.jobs = jobs or default_jobs(self.lanes)
        self._executor = ThreadPoolExecutor(self.jobs, thread_name_prefix="optagent-eval")
        self._busy = [0] * self.lanes  # evaluations in flight per lane: a new one goes to the least busy
        self._lock = threading.Lock()
        self._baselines: dict[int, Future] = {}
        self.baseline_runs = 0  # how many times a baseline job ran (bench/, tests)
        self.baseline_why: list[str] = []  # and why each one after the first (bench/)
        self._crowd = Crowd()
        self.alone_runs = 0  # evaluations run again alone after a verdict company or the host can cause (crowd.py)
        # as many candidate processes started ahead on each lane as evaluations may run on it at once (a re-time's
        # two included), from the start: their start-up paid while the planner thinks, never beside a timed phase
        # (its lane waits for them: warm_worker.py), the run's first evaluation in one too
        evaluator.keep_spares(max(2, -(-self.jobs // self.lanes)) if (n := settings().spares) is None else n, self.lane_list)
        for lane in self.lane_list if evaluator.spares else ():
            evaluator.spares.top_up(lane.device)
        # the host's memory written once, no timed phase beside it (host_memory.py): a process on new pages runs slow
        self._touch = host_memory.touch_before_timing(self.lane_list, settings().touch_gib, evaluator.device)

    @property
    def planned_isolation(self):
        return self.evaluator.planned_isolation

    def evaluate(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None,
                 stop: Optional[threading.Event] = None) -> Iterator[tuple[PoolJob, EvalResult]]:
        """stop: set by another thread (a cluster actor's caller gave up) ends the evaluations as a close does."""
        stop = stop or threading.Event()
        sink = serialised(progress)
        futures = {self._executor.submit(self._one, job, None, stop, sink): job for job in jobs}
        try:
            pending = set(futures)
            while pending:
                done, pending = waits.first_done(pending)  # in slices: Ctrl-C is heard at once (waits.py)
                for f in done:
                    yield futures[f], f.result()
        finally:  # the caller stopped early (Ctrl-C, an error): no evaluation of this call outlives it
            stop.set()
            for f in futures:
                f.cancel()

    def retime(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None,
               stop: Optional[threading.Event] = None) -> list[EvalResult]:
        """All on lane 0, held for the whole batch, timed back to back in order; timing only (search/accept.py
        floors a re-time by the judged timing). The lane's spares are topped up after the batch, not beside it."""
        lane = self.lane_list[0]
        base = self._baseline(lane)
        waits.all_done([base])  # before the lane is held: the baseline job times in it too
        stop = stop or threading.Event()
        sink = serialised(progress)
        token = ("retime", object())
        lane.acquire(token)
        try:
            ordered = OrderedLane(lane, list(range(len(jobs))))
            futures = [self._executor.submit(self._one, job, (ordered, i, base), stop, sink)
                       for i, job in enumerate(jobs)]
            return [waits.result(f) for f in futures]
        finally:
            stop.set()
            lane.release(token)
            if self.evaluator.spares:
                self.evaluator.spares.top_up(lane.device)

    def _one(self, job: PoolJob, fixed, stop: threading.Event, sink: Optional[ProgressSink]) -> EvalResult:
        alone = False  # the only evaluation on its lane as it starts: its judges may split its cases (judges.py)
        if fixed is not None:
            lane, who, base = fixed
        else:
            with self._lock:
                index = min(range(self.lanes), key=lambda i: self._busy[i])
                self._busy[index] += 1
                alone = self._busy[index] == 1
            lane, who, base = self.lane_list[index], object(), None
        try:
            future = base if base is not None else self._baseline(lane)

            def once() -> EvalResult:
                return self.evaluator.evaluate_on(
                    job.source, job.language, stamped(sink, step=job.key), gate=Gate(lane, who, stop),
                    control=Control(lane.device, stop), baselines=lambda: _baselines_of(future), judge=fixed is None,
                    judges=None if alone else 1)
            with self._crowd.member():
                # a re-time's turn on its ordered lane has passed: never again
                result = once() if fixed is not None else self._again_alone(once, stop)
            return result.model_copy(update={"timed_on": lane.name})
        finally:
            if fixed is None:
                with self._lock:
                    self._busy[lane.index] -= 1

    def _again_alone(self, once: Callable[[], EvalResult], stop: threading.Event) -> EvalResult:
        """once(), and once more with no other evaluation of the pool running where its verdict is one that its
        company or the host can cause (crowd.py): not the kernel's fault until it fails so alone too."""
        ran_alone: list[bool] = []

        @contextmanager
        def by_itself() -> Iterator[None]:
            with self._crowd.alone(stop):
                self.alone_runs += 1
                ran_alone.append(True)
                yield

        def again(result: EvalResult) -> bool:
            return again_alone(result, self.jobs) and not stop.is_set()
        result = once_more_alone(once, again, by_itself)
        if ran_alone and again(result):
            result = result.model_copy(update={"reason": f"{result.reason} ({ALONE_TOO})"})
        return result

    def _baseline(self, lane: Lane) -> Future:
        """The lane's baseline timing: the current one while fresh, else a new baseline job, started now."""
        with self._lock:
            current = self._baselines.get(lane.index)
            why = _stale(current) if current is not None and current.done() else None
            if current is None or why:
                if why:
                    self.baseline_why.append(why)
                current = Future()
                self._baselines[lane.index] = current
                self.baseline_runs += 1
                threading.Thread(target=self._time_baselines, args=(lane, current), daemon=True,
                                 name="optagent-baseline").start()
            return current

    def _time_baselines(self, lane: Lane, out: Future) -> None:
        try:
            run = self.evaluator.time_baselines(Gate(lane, ("baseline", object())))
            probe = _host_probe()  # after: its lane waited for the processes starting for it (spares)
            got = run.all(Baseline) if run.first(Done) else []
            slow = any(b.timing.host_slow for b in got)
            out.set_result(LaneBaseline(got, probe, time.monotonic(), slow) if got else None)
        except BaseException as e:  # the evaluations waiting for it get no baseline, and say nothing false
            out.set_exception(e)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.evaluator.drop_spares()
        take_down.reaped()  # judges that answered, still ending: none outlives its pool
        host_memory.finish(self._touch)


def _baselines_of(future: Future) -> list[Baseline]:
    try:
        got = future.result()
    except Exception:
        return []
    return list(got.baselines) if got else []


def _stale(future: Future) -> Optional[str]:
    """Why the lane's baseline timing is to be taken again, or None."""
    try:
        got: Optional[LaneBaseline] = future.result()
    except Exception as e:
        return f"the baseline job failed ({type(e).__name__})"
    if got is None:
        return "the baseline job gave no timing"
    age = time.monotonic() - got.at
    if age > MAX_AGE_S:
        return f"{age:.0f} s old"
    if age < MIN_AGE_S:
        return None
    if got.slow:
        return "taken on a slow host"
    now = _host_probe()
    if now > host_speed.SLACK * got.probe_us or got.probe_us > host_speed.SLACK * now:
        return f"the host probe moved from {got.probe_us:.1f} to {now:.1f} us"
    return None


def _host_probe() -> float:
    return min(host_speed.probe_us() for _ in range(PROBES))
