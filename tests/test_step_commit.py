"""One atomic commit per step, tested by fault injection.

A scripted run is crashed (a BaseException the loop does not catch, as a kill) before and after each write of
its steps, and given a full disk (ENOSPC) at each fsync; then resumed by a fresh store and loop. Every time the
resumed run must hold each step once, in order, with the outcome the run without faults gave it, a best/ that
belongs to the step accepted last, a state that follows the steps, and no temporary file. A real kill -9 of a
subprocess at random points, several times over one run, must end the same way.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.evaluation.serial_pool import SerialPool
from optagent.protocols import PlannerExhausted
from optagent.runs.view import PlannerContext
from optagent.schema import Language, Proposal, RunConfig, RunStatus, Status, StepOutcome, Usage
from optagent.runs import files as run_files
from optagent.search.loop import Limits, Loop
from optagent.runs.store import RunStore, new_run_id
from optagent.runs.files import RunError
from optagent.runs.trajectory import Trajectory
from optagent.task import load_task

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_loop import ScriptedEvaluator  # noqa: E402

# index -> candidate (None: a reply without a kernel); with TIMES, every kind of step and every write of the best:
# accepted outright, accepted after a re-time, slower, failing, no kernel, lost on the re-time (the incumbent
# re-timed at 44 us, its record replaced), and a step after that one.
PLAN = {1: "a", 2: "b", 3: "c", 4: None, 5: "d", 6: "e", 7: "f", 8: "g"}
TIMES = {"starter": [100.0], "a": [50.0], "b": [60.0], "c": [Status.COMPILE_ERROR], "d": [45.0, 45.0, 44.0],
         "e": [40.0, 46.0], "f": [47.0], "g": [30.0]}
OUTCOMES = [StepOutcome.BASELINE, StepOutcome.ACCEPTED, StepOutcome.NOT_BETTER, StepOutcome.FAILED,
            StepOutcome.NO_KERNEL, StepOutcome.ACCEPTED, StepOutcome.NOT_BETTER, StepOutcome.NOT_BETTER,
            StepOutcome.ACCEPTED]


class Crash(BaseException):
    """A kill at this point: nothing in the loop catches it, nothing after it runs."""


class IndexPlanner:
    """Proposes by step index, so a resumed run continues where the killed one stopped."""

    name, model = "scripted", None

    def propose(self, ctx: PlannerContext) -> Proposal:
        if ctx.step_index not in PLAN:
            raise PlannerExhausted("done")
        src = PLAN[ctx.step_index]
        if src is None:
            return Proposal(idea="nothing", error="reply held no kernel")
        return Proposal(source=src, idea=f"try {src}", usage=Usage(prompt_tokens=10))


@functools.lru_cache(maxsize=None)
def task_of(task_dir: Path):
    return load_task(task_dir)  # a second per load: read once, the crash tests drive hundreds of loops


def times() -> dict:
    return {k: list(v) for k, v in TIMES.items()}


def new_run(root: Path, task_dir: Path) -> RunStore:
    task = task_of(task_dir)
    cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name, task_digest="x",
                    language=Language.TRITON, device="cpu", planner="offline", timeout_s=10, min_gain=0.01,
                    patience=100, max_steps=len(PLAN))
    return RunStore.create(root, cfg, "starter")


def drive(path: Path, task_dir: Path, evaluator) -> object:
    return Loop(RunStore(path), task_of(task_dir), IndexPlanner(), SerialPool(evaluator),
                Limits(max_steps=len(PLAN), patience=100)).run()


def leftovers(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name.endswith(".tmp"))


def assert_consistent(path: Path) -> None:
    """The run as a fresh reader sees it: every step once, in order, as scripted; best/ and state follow them."""
    store = RunStore(path)
    steps = store.steps()
    assert [s.index for s in steps] == list(range(len(PLAN) + 1))
    assert [s.outcome for s in steps] == OUTCOMES, [s.outcome.value for s in steps]
    assert [s.idea for s in steps][1:] == [f"try {PLAN[i]}" if PLAN[i] else "nothing" for i in sorted(PLAN)]
    assert store.unfinished_steps() == [] and leftovers(path) == []
    dirs = sorted(d.name for d in (path / "steps").iterdir())
    assert dirs == [f"{i:04d}" for i in range(len(PLAN) + 1)]  # no stray step folder, temp or not
    for s in steps:
        assert (s.result is None) == (not (store.step_dir(s.index) / "result.json").exists())
    last = max(s.index for s in steps if s.outcome in (StepOutcome.ACCEPTED, StepOutcome.BASELINE))
    source, result = store.best()
    assert source == store.step_source(last) == "g"
    # its result is that step's own, or a later re-time of it (a step after it that names it)
    named = [s.best for s in steps if s.best is not None and s.best.step == last]
    assert result in [steps[last].result, *(r.result for r in named)] and result == named[-1].result
    assert (path / "best" / "diff.patch").read_text().count("+g") == 1
    traj = Trajectory.load(store)
    assert traj.best == (source, result, last) and not traj.cache_stale
    state = store.state()
    assert state.status is RunStatus.MAX_STEPS and state.steps == len(steps) and state.best_step == last
    assert state.usage == traj.usage and state.usage.prompt_tokens == 10 * sum(1 for v in PLAN.values() if v)
    assert state.best_geomean_speedup == pytest.approx(result.geomean_speedup)


def count_writes(monkeypatch, path: Path, task_dir: Path) -> int:
    calls = []
    real = run_files.atomic_write
    monkeypatch.setattr(run_files, "atomic_write", lambda p, t: (calls.append(p), real(p, t)))
    drive(path, task_dir, ScriptedEvaluator(times()))
    monkeypatch.undo()
    assert_consistent(path)
    return len(calls)


@pytest.fixture(scope="module")
def writes_per_run(tmp_path_factory, task_dir) -> int:
    mp = pytest.MonkeyPatch()
    try:
        return count_writes(mp, new_run(tmp_path_factory.mktemp("ref"), task_dir).path, task_dir)
    finally:
        mp.undo()


def crash_then_resume(path: Path, task_dir: Path, monkeypatch, fail) -> None:
    evaluator = ScriptedEvaluator(times())  # shared: a re-timed kernel keeps its later timing after the resume
    with pytest.raises((Crash, RunError)) as failed:
        fail()
        drive(path, task_dir, evaluator)
    if failed.type is RunError:  # a full disk: one line naming the file, as the CLI prints it
        assert str(path) in str(failed.value) and str(failed.value).endswith("cannot write: No space left on device")
    monkeypatch.undo()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", no_fsync)
        assert drive(path, task_dir, evaluator).status is RunStatus.MAX_STEPS
    assert_consistent(path)


def no_fsync(fd: int) -> None:
    """What is tested here is the order of the writes, not the disk's durability: fsync costs seconds per run."""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_before_or_after_any_write_resumes_consistently(tmp_path, task_dir, monkeypatch, writes_per_run,
                                                                when):
    for k in range(1, writes_per_run + 1):
        store = new_run(tmp_path / f"{when}{k}", task_dir)
        real, calls = run_files.atomic_write, []

        monkeypatch.setattr(os, "fsync", no_fsync)

        def write(p: Path, text: str, k=k) -> None:
            calls.append(p)
            if when == "before" and len(calls) == k:
                raise Crash(f"killed before writing {p}")
            real(p, text)
            if when == "after" and len(calls) == k:
                raise Crash(f"killed after writing {p}")

        crash_then_resume(store.path, task_dir, monkeypatch,
                          lambda: monkeypatch.setattr(run_files, "atomic_write", write))
        assert len(calls) >= k, f"write {k} never happened"


def test_a_full_disk_at_any_fsync_resumes_consistently(tmp_path, task_dir, monkeypatch, writes_per_run):
    """Each write fsyncs its temp file, then the folder after the rename: a full disk at either."""
    for k in range(1, 2 * writes_per_run + 1):
        store = new_run(tmp_path / f"enospc{k}", task_dir)
        calls = []

        def fsync(fd: int, k=k) -> None:
            calls.append(fd)
            if len(calls) == k:
                raise OSError(errno.ENOSPC, "No space left on device")
            no_fsync(fd)

        crash_then_resume(store.path, task_dir, monkeypatch, lambda: monkeypatch.setattr(os, "fsync", fsync))
        assert len(calls) >= k


def test_a_crash_between_the_commit_and_the_best_cache_is_repaired_on_resume(tmp_path, task_dir, monkeypatch):
    """The state the issue found: best/ ahead of (or here, behind) the steps. The commit decides."""
    store = new_run(tmp_path, task_dir)
    real = run_files.atomic_write

    def write(p: Path, text: str) -> None:
        if p.parent.name == "best" and (store.step_dir(1) / "step.json").exists():
            raise Crash("killed after step 1's commit, before its best/ cache")
        real(p, text)

    monkeypatch.setattr(run_files, "atomic_write", write)
    with pytest.raises(Crash):
        drive(store.path, task_dir, ScriptedEvaluator(times()))
    monkeypatch.undo()
    assert store.best()[0] == "starter" and store.steps()[1].best.step == 1  # the cache is behind the commit
    traj = Trajectory.load(RunStore(store.path))
    assert traj.cache_stale and traj.best.source == "a"
    drive(store.path, task_dir, ScriptedEvaluator(times()))
    assert_consistent(store.path)


def test_a_recorded_run_resumes_from_the_best_its_commits_name(tmp_path, task_dir):
    """The recorded sample run (every step with its parent and round, the best in the commits) resumes."""
    import shutil

    sample = next((HERE / "fixtures" / "run_sample").iterdir())
    run = tmp_path / sample.name
    shutil.copytree(sample, run)
    store = RunStore(run)
    before = store.steps()
    assert before and all(s.round is not None for s in before) and any(s.best is not None for s in before)
    traj = Trajectory.load(store)
    assert traj.best is not None and (traj.best.source, traj.best.result) == store.best()
    assert traj.best.step == traj.best_step and not traj.cache_stale
    kernel = (run / "best" / "kernel.py").read_text()
    task = load_task(task_dir)
    ev = ScriptedEvaluator({traj.best.source: [1e6], "worse": [1e9]})
    planner = type("P", (), {"name": "p", "model": None,
                             "propose": lambda self, ctx: Proposal(source="worse", idea="try worse")})()
    state = Loop(store, task, planner, SerialPool(ev), Limits(max_steps=traj.candidates + 1, patience=100)).run()
    assert state.steps == len(before) + 1 and store.steps()[-1].outcome is StepOutcome.NOT_BETTER
    assert (run / "best" / "kernel.py").read_text() == kernel and store.steps()[:-1] == before


def _kill_driver(path: str, task_dir: str, delay_s: float) -> None:
    """Run as a subprocess: drive the run, each evaluation taking a little time, so a kill lands anywhere."""
    import time

    import json

    # The scripted machine's history outlives each process: a resumed round re-times a candidate whose first
    # timing a killed process took, so its next timing must follow on, as it does in the in-process tests.
    calls = Path(path + ".calls.json")

    class Slow(ScriptedEvaluator):
        def evaluate(self, source, language, progress=None):
            time.sleep(delay_s)
            counts = json.loads(calls.read_text()) if calls.exists() else {}
            seq = TIMES[source]
            n = counts.get(source, 0)
            self.times[source] = [seq[min(n, len(seq) - 1)]]
            counts[source] = n + 1
            tmp = calls.with_suffix(".tmp")
            tmp.write_text(json.dumps(counts))
            os.replace(tmp, calls)
            return super().evaluate(source, language, progress)

    print("ready", flush=True)
    drive(Path(path), Path(task_dir), Slow(times()))


def test_kill_9_at_random_points_then_resume(tmp_path, task_dir):
    store = new_run(tmp_path, task_dir)
    cmd = [sys.executable, __file__, str(store.path), str(task_dir)]
    rng = random.Random(19)
    killed = 0
    for _ in range(12):
        proc = subprocess.Popen(cmd + ["0.05"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        try:
            proc.wait(timeout=rng.uniform(0.0, 0.25))
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL: no handler, no flush, no cleanup
            proc.wait()
            killed += 1
        finally:
            proc.stdout.close()
        if proc.returncode == 0:
            break  # finished between two kills
    assert killed >= 3
    done = subprocess.run(cmd + ["0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_consistent(store.path)


if __name__ == "__main__":
    _kill_driver(sys.argv[1], sys.argv[2], float(sys.argv[3]))
