"""The judges started beside a candidate (warm_worker.py), and a candidate's cases split between them.

A judge's seconds are Python's, sample after sample (rebuilding inputs, two references and the task's
check() each: 4.3 s for the decode starter's 199 samples on the H200, with the GPU idle otherwise and the
candidate's process already gone), so two processes that each judge half of the cases take half the time.
Each is a whole judge: trusted, in the candidate's scratch directory under the same isolation, handed only
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

from optagent.evaluation.lanes import Control
from optagent.evaluation.safe_files import open_samples
from optagent.evaluation.sandbox import WorkerRun, run_worker
from optagent.evaluation.scratch import scratch_fd
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
    def __init__(self, template: Job, n: int, timeout_s: float, control: Optional[Control]):
        self.timeout_s, self.control = timeout_s, control
        self.workers: list[WarmWorker] = []
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

    def adopt(self, n: int, control: Optional[Control]) -> "Judges":
        """A spare's judges (started with it: warm_worker.Spares) for its evaluation: at most n of them kept,
        each under the evaluation's control (its stop flag) from now on."""
        for w in self.workers[n:]:
            w.abandon()
        self.workers = self.workers[:n]
        self.control = control
        for w in self.workers:
            w.spawned.control = control or w.spawned.control
        return self

    def abandon(self) -> None:
        """The ones not used (or all, when the evaluation ended otherwise) taken down."""
        for w in self.workers:
            w.abandon()
