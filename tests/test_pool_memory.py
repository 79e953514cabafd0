"""A GPU and a host shared by a pool's evaluations fail a kernel for reasons not its own (the device's memory runs
out; the harness's work between timed calls runs slow): such a verdict is evaluated again with no other
evaluation of the pool running, and counts only if it comes again alone."""

from __future__ import annotations

import threading
import time

from optagent.evaluation.pool import LocalPool
from optagent.evaluation.referee_log import NOT_THE_HARNESS
from optagent.evaluation.timer_check import MOVED
from optagent.evaluation.sandbox import WorkerRun
from optagent.protocols import PoolJob
from optagent.schema import Device, EvalResult, Language, Status

OOM = "case 9: OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB."
SLOW = ("case 1: 891 us passed between its timed calls (gpu loop), against 276 us of the harness's own work there "
        f"in the baseline's loop: {MOVED}")
STRETCHED = ("case 10: the timer's records give 2167 us a call, but the referee's own clock saw 6888 us a call "
             f"(6950 us in three call windows of four, less 62 us of the harness's own): {NOT_THE_HARNESS}")


class CrowdedGpu:
    """Each evaluation takes 0.3 s; `hungry` sources run out of memory whenever another runs beside them
    (`greedy` ones always); `broken` ones fail otherwise. Records how many ran beside each."""

    device = Device.CUDA
    spares = None  # no candidate processes started ahead (evaluation/warm_worker.py)

    def keep_spares(self, per_device: int, lanes=()) -> None: ...

    def drop_spares(self) -> None: ...

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.calls: list[tuple[str, int]] = []  # (source, how many ran at once at its end)
        self.together = 1  # how many first runs start side by side (run())
        self.judges: dict[str, object] = {}  # source -> the judges the pool allowed it (evaluation/judges.py)

    def time_baselines(self, gate=None) -> WorkerRun:
        if gate is not None:
            gate.close()
        return WorkerRun()

    def evaluate_on(self, source, language, progress=None, *, gate=None, control=None, baselines=None, judge=True,
                    judges=None):
        gate.close()
        with self.lock:
            self.now += 1
            first = source not in self.judges
            self.judges[source] = judges
        # a first run starts beside the others of its round (at most 5 s: a loaded host schedules threads late),
        # so that which ran in company does not rest on the host's timing
        deadline = time.monotonic() + 5.0
        while first and self.now < self.together and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.lock:
            at_start = self.now
        time.sleep(0.3)
        with self.lock:
            crowd = max(at_start, self.now)  # those it started after, or those that started after it
            self.now -= 1
            self.calls.append((source, crowd))
        status, reason = Status.PASSED, None
        if source == "greedy" or (source.startswith("hungry") and crowd > 1):
            status, reason = Status.RUNTIME_ERROR, OOM
        elif source == "mover" or (source == "slowed" and crowd > 1):
            status, reason = Status.REJECTED, SLOW
        elif source == "forger" or (source == "stretched" and crowd > 1):
            status, reason = Status.REJECTED, STRETCHED
        elif source == "broken":
            status, reason = Status.RUNTIME_ERROR, "case 1: ValueError: no good"
        return EvalResult(status=status, reason=reason, language=language, device=Device.CUDA, source_sha256=source,
                          wall_s=0.3)


def run(sources: list[str], jobs: int = 3) -> tuple[dict[str, EvalResult], CrowdedGpu, LocalPool]:
    gpu = CrowdedGpu()
    gpu.together = min(jobs, len(sources))
    pool = LocalPool(gpu, jobs=jobs, devices=[None])
    try:
        got = {job.source: r for job, r in pool.evaluate([PoolJob(i, s, Language.TRITON) for i, s in enumerate(sources)])}
    finally:
        pool.close()
    return got, gpu, pool


def test_a_kernel_that_ran_out_of_memory_in_company_is_evaluated_again_alone():
    got, gpu, pool = run(["hungry-1", "hungry-2", "hungry-3"])
    assert all(r.status is Status.PASSED for r in got.values()), got
    assert pool.alone_runs == 3
    again = [crowd for source, crowd in gpu.calls[3:]]
    assert again == [1, 1, 1]  # each second run had the GPU to itself


def test_a_kernel_that_runs_out_alone_too_fails_and_other_failures_are_not_run_again():
    got, gpu, pool = run(["greedy", "broken", "hungry-1"])
    assert got["greedy"].status is Status.RUNTIME_ERROR and got["greedy"].reason.endswith("(alone too)")
    assert got["broken"].status is Status.RUNTIME_ERROR and [s for s, _ in gpu.calls].count("broken") == 1
    assert got["hungry-1"].status is Status.PASSED
    assert pool.alone_runs == 2


def test_one_evaluation_at_a_time_is_never_run_twice():
    got, gpu, pool = run(["greedy"], jobs=1)
    assert got["greedy"].status is Status.RUNTIME_ERROR and pool.alone_runs == 0 and len(gpu.calls) == 1


def test_work_moved_in_company_is_looked_at_again_alone_and_a_cheat_is_still_caught():
    got, gpu, pool = run(["slowed", "mover", "hungry-1"])
    assert got["slowed"].status is Status.PASSED  # the host was busy, not the kernel
    assert got["mover"].status is Status.REJECTED and got["mover"].reason.endswith(f"{MOVED} (alone too)")
    assert pool.alone_runs == 3


def test_a_claim_the_referee_saw_stretched_in_company_is_looked_at_again_alone_and_a_forger_is_still_caught():
    got, gpu, pool = run(["stretched", "forger", "hungry-1"])
    assert got["stretched"].status is Status.PASSED  # the neighbours stretched the referee's windows
    assert got["forger"].status is Status.REJECTED
    assert got["forger"].reason.endswith(f"{NOT_THE_HARNESS} (alone too)")
    assert pool.alone_runs == 3
