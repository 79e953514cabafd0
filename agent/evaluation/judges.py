"""The judges of an evaluation: started beside its candidate (warm_worker.py), or, in a run's pool, judges that
serve one evaluation after another (JudgeService); and a candidate's cases split between them.

A judge's seconds are Python's, sample after sample (rebuilding inputs, two references and the task's
check() each: 4.3 s for the decode starter's 199 samples on the H200, with the GPU idle otherwise and the
candidate's process already gone), so two processes that each judge half of the cases take half the time.
Each is a whole judge: trusted, under the same isolation (in the candidate's scratch directory, or its own), handed only
its own cases' saved outputs, opened by the parent (safe_files.py); the verdicts are per case, so the
parent reads the two answers as one. One judge where there is nothing to split (one case), where the
evaluations of a pool already run side by side (LocalPool says how many), and for an evaluator's first
judge: it measures the GPU's ceilings and caches them (worker/bench.py), which two judges side by side
would each measure with the other's work beside it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from optagent.evaluation.gates import Control
from optagent.evaluation.safe_files import open_samples
from optagent.evaluation.sandbox import WorkerRun, run_worker
from optagent.evaluation.scratch import remove_scratch, scratch_fd
from optagent.evaluation.warm_worker import WarmWorker
from optagent.messages import CaseSpec, Job, Message

SIDE_BY_SIDE = 2  # judges of one evaluation, at most


def split_cases(job: Job, n: int) -> list[list[CaseSpec]]:
    """The cases in at most n groups of about as many saved samples each (largest first, to the lightest
    group), each group in the job's own case order; no group is empty."""
    groups: list[list[CaseSpec]] = [[] for _ in range(max(1, min(n, len(job.cases))))]
    weight = [0] * len(groups)
    for case in sorted(job.cases, key=lambda c: -len(job.samples.get(c.label, []))):
        light = weight.index(min(weight))
        groups[light].append(case)
        weight[light] += max(1, len(job.samples.get(case.label, [])))
    order = {c.label: i for i, c in enumerate(job.cases)}
    return [sorted(g, key=lambda c: order[c.label]) for g in groups if g]


def part(job: Job, cases: list[CaseSpec]) -> Job:
    """The judge's job for some of its cases: their samples and the parent's expectations only."""
    labels = {c.label for c in cases}
    return job.model_copy(update={"cases": cases,
                                  "samples": {k: v for k, v in job.samples.items() if k in labels},
                                  "expected": {k: v for k, v in job.expected.items() if k in labels}})


def merged(runs: list[WorkerRun]) -> WorkerRun:
    """The judges' answers as one: every message, and how the first that failed ended (else the first's)."""
    failed = next((r for r in runs if r.limit or r.timed_out or r.returncode), runs[0])
    return replace(failed, messages=[m for r in runs for m in r.messages],
                   foreign_lines=sum(r.foreign_lines for r in runs), wall_s=max(r.wall_s for r in runs),
                   stderr_tail="\n".join(r.stderr_tail for r in runs if r.stderr_tail))


class Judges:
    def __init__(self, template: Optional[Job], n: int, timeout_s: float, control: Optional[Control]):
        self.timeout_s, self.control = timeout_s, control
        self.workers: list[WarmWorker] = []
        self.service: Optional[JudgeService] = None  # leased from it (leased()): given back, not taken down
        self.device: Optional[str] = None
        try:
            for _ in range(n):
                self.workers.append(WarmWorker(template, timeout_s, control))
        except BaseException:
            self.abandon()
            raise

    def run(self, job: Job, on_message: Optional[Callable[[Message], None]]) -> WorkerRun:
        """Judge `job`, its cases split between the judges still alive; with none (none was started, or each
        died while it waited) one judge started now (run_worker) takes them all. The saved outputs are opened
        by the parent, under the names the harness gives them: a judge reads descriptors, never a path the
        candidate's message names (safe_files.py)."""
        alive = [w for w in self.workers if w.spawned.proc.poll() is None]
        groups = split_cases(job, max(1, len(alive)))
        lock = threading.Lock()

        def heard(m: Message) -> None:  # the progress sink hears one judge at a time
            if on_message:
                with lock:
                    on_message(m)

        runs: list[Optional[WorkerRun]] = [None] * len(groups)
        errors: list[BaseException] = []

        def one(k: int) -> None:
            try:
                sub, fds = open_samples(part(job, groups[k]), scratch_fd(Path(job.scratch)))
                try:
                    got = alive[k].run(sub, fds, on_message=heard) if k < len(alive) else None
                    runs[k] = got or run_worker(sub, self.timeout_s, on_message=heard, control=self.control, fds=fds)
                finally:
                    for fd in fds:
                        os.close(fd)
            except BaseException as e:  # raised again in the caller's thread, below
                errors.append(e)

        threads = [threading.Thread(target=one, args=(k,), name=f"optagent-judge-{k}") for k in range(1, len(groups))]
        for t in threads:
            t.start()
        try:
            one(0)
        finally:
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return merged([r for r in runs if r is not None])

    @classmethod
    def leased(cls, service: "JudgeService", n: int, device: Optional[str], control: Optional[Control]) -> "Judges":
        """Up to n of the service's idle judges for one evaluation, under its control (its stop flag) meanwhile."""
        judges = cls(None, 0, service.timeout_s, control)
        judges.service, judges.device = service, device
        judges.workers = service.lease(n, device)
        for w in judges.workers:
            w.spawned.control = control or w.spawned.control
        return judges

    def abandon(self) -> None:
        """The ones not used (or all, when the evaluation ended otherwise) taken down; leased ones given back."""
        workers, self.workers = self.workers, []
        if self.service is not None:
            self.service.give_back(self.device, workers)
            return
        for w in workers:
            w.abandon()


class JudgeService:
    """Judges that serve one evaluation after another: a run's pool keeps `per_device` for each lane device (on a
    GPU under bubblewrap, where it keeps spare candidate processes: warm_worker.available), each in a scratch
    directory of its own, under the same isolation as every judge. An evaluation leases as many as it may use
    once its candidate's process has ended, hands each its saved outputs by descriptor as before, and gives them
    back once they have answered (their Done); a judge that died, broke a limit or ran out of time is replaced.
    A judge loads no candidate code, ever, and a candidate cannot reach it (its own PID namespace and file system);
    what it keeps from one job to the next is the harness's own (torch, the package, the GPU's context). Why:
    each spare used to start its two judges with it, three processes importing torch (4-5 s on the H200) for each
    candidate, and a lane's timed phase waits for the processes starting for it (warm_worker.Spares.settle)."""

    def __init__(self, template: Callable[[], Job], timeout_s: float, per_device: int, devices: list[Optional[str]],
                 on_start: Callable[[Optional[str], WarmWorker], None]):
        """template: a judge's job in a new scratch directory, as far as it is known before any evaluation;
        on_start: told of each judge started, whose start-up a lane then waits for (Spares.track)."""
        self.template, self.timeout_s, self.on_start = template, timeout_s, on_start
        self._lock = threading.Lock()
        self._idle: dict[Optional[str], list[WarmWorker]] = {d: [] for d in devices}
        self._all: list[WarmWorker] = []
        self._closed = False
        for device in devices:
            for _ in range(per_device):
                self._start(device)

    def _start(self, device: Optional[str]) -> None:
        job = self.template()
        try:
            worker = WarmWorker(job, self.timeout_s, Control(device), serving=True)
        except Exception:
            remove_scratch(Path(job.scratch))
            return  # one judge fewer: an evaluation that finds none idle starts one of its own
        with self._lock:
            self._all.append(worker)
            self._idle.setdefault(device, []).append(worker)
        self.on_start(device, worker)

    def lease(self, n: int, device: Optional[str]) -> list[WarmWorker]:
        with self._lock:
            idle = self._idle.setdefault(device, [])
            alive = [w for w in idle if _alive(w)]
            taken, self._idle[device] = alive[:n], alive[n:]
            dead = [w for w in idle if w not in alive]
        self._replace(device, dead)
        return taken

    def give_back(self, device: Optional[str], workers: list[WarmWorker]) -> None:
        dead = [w for w in workers if not _alive(w)]
        with self._lock:
            closed = self._closed
            kept = [w for w in workers if w not in dead and not closed]
            for w in kept:
                w.spawned.control = Control(device)
            self._idle.setdefault(device, [])[:0] = kept  # first in line again: the package loaded, the GPU warm
        self._replace(device, dead if not closed else workers)

    def _replace(self, device: Optional[str], dead: list[WarmWorker]) -> None:
        for w in dead:
            _take_down(w)
            with self._lock:
                if w in self._all:
                    self._all.remove(w)
                again = not self._closed
            if again:
                self._start(device)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = list(self._all), []
            self._idle.clear()
        for w in workers:
            _take_down(w)


def _alive(worker: WarmWorker) -> bool:
    return not worker.spawned.collected and worker.spawned.proc.poll() is None


def _take_down(worker: WarmWorker) -> None:
    worker.abandon()
    remove_scratch(worker.scratch)
