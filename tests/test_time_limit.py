"""--time-limit ends a run with evaluations in flight: they are cut off, recorded as unfinished, and a
resume evaluates them again (waits.py's deadline, the loop, the local pool's stop)."""

from __future__ import annotations

import hashlib
import threading
import time

from optagent.evaluation.gates import Stopped
from optagent.evaluation.pool import LocalPool
from optagent.protocols import PlannerExhausted
from optagent.schema import (CaseKind, CaseResult, Device, EvalResult, Language, Proposal, RunConfig, RunStatus,
                             Status, Timing)
from optagent.search.loop import Limits, Loop
from optagent.runs.store import RunStore, new_run_id
from optagent.task import load_task


def passed(source: str, us: float) -> EvalResult:
    t = Timing(median_us=us, p10_us=us, p90_us=us, samples=10)
    case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time=t, time_us=us, baseline_us=100.0)
    return EvalResult(status=Status.PASSED, language=Language.TRITON, device=Device.CPU, wall_s=0.0, cases=[case],
                      source_sha256=hashlib.sha256(source.encode()).hexdigest())


class NoBaselines:
    def first(self, kind):
        return None


class FakeSandbox:
    """The sandboxed evaluator's surface the local pool uses; sources in `hang` run until the pool stops them,
    as a worker that never finishes is killed by its Control's stop flag."""

    device, planned_isolation = Device.CPU, None
    spares = None  # no candidate processes started ahead (evaluation/warm_worker.py)

    def keep_spares(self, per_device: int, lanes=()) -> None: ...

    def drop_spares(self) -> None: ...

    def __init__(self, times: dict[str, float], hang: set[str]):
        self.times, self.hang, self.calls, self.stopped = times, hang, [], []

    def time_baselines(self, gate):
        return NoBaselines()

    def evaluate_on(self, source, language, progress, gate=None, control=None, baselines=None,
                    judge=True, judges=None) -> EvalResult:
        self.calls.append(source)
        if source in self.hang:
            while not control.stopped():
                time.sleep(0.02)
            self.stopped.append(source)
            raise Stopped("the candidate process was stopped")
        return passed(source, self.times[source])


class Planner:
    name, model = "scripted", None

    def __init__(self, sources: list[str]):
        self.sources = list(sources)

    def propose(self, ctx) -> Proposal:
        if not self.sources:
            raise PlannerExhausted("done")
        src = self.sources.pop(0)
        return Proposal(source=src, idea=f"try {src}")


def test_a_run_cut_off_at_its_time_limit_in_flight_resumes_the_cut_evaluation(tmp_path, task_dir):
    task = load_task(task_dir)
    cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name, task_digest="x",
                    language=Language.TRITON, device="cpu", planner="offline", timeout_s=600, min_gain=0.01,
                    patience=5, max_steps=10, time_limit_s=1.0)
    store = RunStore.create(tmp_path / "runs", cfg, "starter")
    slow = FakeSandbox({"starter": 100.0}, hang={"slow"})
    pool = LocalPool(slow, jobs=2, devices=[None])
    t0 = time.monotonic()
    try:
        state = Loop(store, task, Planner(["slow"]), pool, Limits(time_limit_s=1.0)).run()
    finally:
        pool.close()
    took = time.monotonic() - t0
    # ended at the limit (not at the evaluation's own 600 s timeout), the cut evaluation stopped
    assert took < 1.0 + 15, took
    assert state.status is RunStatus.TIME_LIMIT and "in flight" in state.reason
    assert slow.stopped == ["slow"]
    assert [s.index for s in store.steps()] == [0]  # the cut-off step has no record: unfinished, not failed
    assert [i for i, _ in store.unfinished_steps()] == [1]
    assert not [t for t in threading.enumerate() if t.name.startswith("optagent-eval")]

    fast = FakeSandbox({"starter": 100.0, "slow": 50.0}, hang=set())
    again = RunStore.open(tmp_path / "runs", cfg.run_id)
    pool = LocalPool(fast, jobs=2, devices=[None])
    try:
        state = Loop(again, task, Planner([]), pool, Limits(time_limit_s=60.0)).run()
    finally:
        pool.close()
    assert "slow" in fast.calls  # evaluated again on resume
    step = next(s for s in again.steps() if s.index == 1)
    assert step.result is not None and step.result.status is Status.PASSED
    assert state.status is RunStatus.EXHAUSTED


def test_a_starter_cut_off_leaves_the_run_unfinished_not_failed(tmp_path, task_dir):
    task = load_task(task_dir)
    cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name, task_digest="x",
                    language=Language.TRITON, device="cpu", planner="offline", timeout_s=600, min_gain=0.01,
                    patience=5, max_steps=10, time_limit_s=0.5)
    store = RunStore.create(tmp_path / "runs", cfg, "starter")
    pool = LocalPool(FakeSandbox({}, hang={"starter"}), jobs=1, devices=[None])
    try:
        state = Loop(store, task, Planner([]), pool, Limits(time_limit_s=0.5)).run()
    finally:
        pool.close()
    assert state.status is RunStatus.TIME_LIMIT and not store.steps()


def test_the_time_limit_counts_from_the_commands_start_not_the_loops(tmp_path, task_dir):
    """What came before the loop (the starters evaluated to choose the language, the pool's start) is the run's
    time too: Limits.started is the command's start (cli/runs.py)."""
    task = load_task(task_dir)
    cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name, task_digest="x",
                    language=Language.TRITON, device="cpu", planner="offline", timeout_s=600, min_gain=0.01,
                    patience=5, max_steps=10, time_limit_s=30.0)
    store = RunStore.create(tmp_path / "runs", cfg, "starter")
    pool = LocalPool(FakeSandbox({"starter": 100.0}, hang={"slow"}), jobs=1, devices=[None])
    t0 = time.monotonic()
    try:  # 29 of its 30 s already spent before the loop
        state = Loop(store, task, Planner(["slow"]), pool, Limits(time_limit_s=30.0, started=t0 - 29.0)).run()
    finally:
        pool.close()
    assert state.status is RunStatus.TIME_LIMIT and time.monotonic() - t0 < 1.0 + 10
    assert [s.index for s in store.steps()] == [0] and [i for i, _ in store.unfinished_steps()] == [1]


class Starters:
    """An evaluator for pick_language: the languages in `hang` run until their stop is set."""

    def __init__(self, hang: set[Language]):
        self.hang, self.stopped = hang, []

    def evaluate(self, source, language, progress=None, stop=None) -> EvalResult:
        if language in self.hang:
            while not stop.wait(0.02):
                pass
            self.stopped.append(language)
            raise Stopped("the candidate process was stopped")
        return passed(source, 10.0).model_copy(update={"language": language})


def test_the_starters_compared_past_the_deadline_are_stopped_and_the_choice_made_from_the_rest(task_dir):
    from optagent.cli.language import pick_language, runs_here

    task = load_task(task_dir)
    first, second = [lang for lang in task.languages if runs_here(lang, Device.CUDA)][:2]
    said: list[str] = []
    ev = Starters(hang={second})
    t0 = time.monotonic()
    lang, why, results = pick_language(task, Device.CUDA, None, lambda: ev, said.append, deadline=t0 + 1.0)
    assert time.monotonic() - t0 < 1.0 + 10 and ev.stopped == [second]
    assert lang is first and set(results) == {first} and "fastest starter" in why
    assert any("stopped at the time limit" in line for line in said)

    ev = Starters(hang={first})  # none finished: the first language, and why
    lang, why, results = pick_language(task, Device.CUDA, None, lambda: ev, said.append,
                                       deadline=time.monotonic() + 0.5)
    assert lang is first and results == {} and ev.stopped == [first] and "time limit" in why
