"""Store traffic per step does not grow with the run: the loop reads its run once, then writes each step's files once.

Every read of a run's file goes through run_files.read_text and every write through run_files.atomic_write;
both are counted here, with the store's readers and the evaluator's calls, in the order they happen.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from optagent.evaluation.serial_pool import SerialPool
from optagent.schema import Language, Proposal, RunState, Status, StepOutcome
from optagent.runs import files as run_files
from optagent.search.loop import Limits, Loop
from optagent.runs.store import RunStore
from optagent.runs.trajectory import Trajectory
from test_loop import ScriptedEvaluator, ScriptedPlanner, make_run  # noqa: F401  (tests/ is on sys.path; make_run: a fixture)

STORE_READERS = ("steps", "step_source", "best", "state", "unfinished_steps", "unfinished", "proposal")
MAX_WRITES_PER_STEP = 8  # candidate, proposal, 3 best files, result, step, state


class Traffic:
    """Each read, write, store reader call and evaluation, as (kind, what), in order."""

    def __init__(self, monkeypatch, root: Path):
        self.events: list[tuple[str, str]] = []
        read, write = run_files.read_text, run_files.atomic_write

        def counted_read(path: Path) -> str:
            self.events.append(("read", str(path.relative_to(root))))
            return read(path)

        def counted_write(path: Path, text: str) -> None:
            self.events.append(("write", str(path.relative_to(root))))
            write(path, text)

        monkeypatch.setattr(run_files, "read_text", counted_read)
        monkeypatch.setattr(run_files, "atomic_write", counted_write)
        for name in STORE_READERS:
            monkeypatch.setattr(RunStore, name, self._counted(name, getattr(RunStore, name)))

    def _counted(self, name, method):
        def wrapper(store, *args, **kwargs):
            self.events.append(("call", name))
            return method(store, *args, **kwargs)
        return wrapper

    def of(self, kind: str) -> list[str]:
        return [what for k, what in self.events if k == kind]

    def after_first_eval(self, *kinds: str) -> list[tuple[str, str]]:
        first = next(i for i, (k, _) in enumerate(self.events) if k == "eval")
        return [e for e in self.events[first:] if e[0] in kinds]

    def per_step_writes(self) -> list[list[str]]:
        """The writes of each step: each step ends with its state.json."""
        chunks, chunk = [], []
        for kind, what in self.events:
            if kind == "write":
                chunk.append(what)
                if what.endswith("state.json"):
                    chunks.append(chunk)
                    chunk = []
        assert not chunk, f"writes after the last state.json: {chunk}"
        return chunks


class LoggedEvaluator(ScriptedEvaluator):
    def __init__(self, traffic: Traffic, times: dict):
        super().__init__(times)
        self.traffic = traffic

    def evaluate(self, source, language, progress=None):
        self.traffic.events.append(("eval", source))
        return super().evaluate(source, language, progress)


def script(n: int, start: int = 1, best: float = 100.0) -> tuple[list, dict]:
    """n candidates cycling through every kind of step: accepted outright, accepted after a re-time, slower,
    failing, no kernel, and lost on the re-time (the incumbent's record re-timed)."""
    sources, times = [], {}
    for i in range(start, start + n):
        src = f"c{i}"
        kind = i % 6
        if kind == 4:
            sources.append(None)
            continue
        sources.append(src)
        if kind == 0:
            times[src], best = [best * 0.6], best * 0.6
        elif kind == 1:
            times[src], best = [best * 0.9, best * 0.85], best * 0.85
        elif kind == 2:
            times[src] = [best * 1.2]
        elif kind == 3:
            times[src] = [Status.COMPILE_ERROR]
        else:
            times[src] = [best * 0.9, best]
    return sources, times


def run_scripted(make_run, monkeypatch, n: int):
    sources, times = script(n)
    store, loop = make_run(ScriptedPlanner(sources), None, max_steps=n, patience=100)
    traffic = Traffic(monkeypatch, store.path)
    loop.pool = SerialPool(LoggedEvaluator(traffic, {"starter": [100.0], **times}))
    states: list[RunState] = []
    loop.on_step = lambda step, state: states.append(state)
    final = loop.run()
    monkeypatch.undo()
    return store, loop, traffic, states, final


def best_writes_expected(store: RunStore) -> int:
    """The best's files change with a new best, or with the incumbent's re-timed record."""
    steps = store.steps()
    return sum(1 for s in steps if s.outcome in (StepOutcome.ACCEPTED, StepOutcome.BASELINE)) + \
        sum(1 for s in steps if s.outcome is StepOutcome.NOT_BETTER and (s.retime_note or "").startswith("re-timed"))


@pytest.mark.parametrize("n", [5, 20])
def test_reads_and_writes_per_step_do_not_grow_with_the_run(make_run, monkeypatch, n):
    store, loop, traffic, states, final = run_scripted(make_run, monkeypatch, n)
    steps = store.steps()
    assert final.status.value == "MAX_STEPS" and len(steps) == n + 1
    # every kind of step was taken (PASSED is the CPU's; PENDING is never a step's last word)
    assert {s.outcome for s in steps} == set(StepOutcome) - {StepOutcome.PASSED, StepOutcome.PENDING}
    # a new run reads only its starter, before anything is evaluated; nothing is read after
    assert traffic.of("read") == ["starter.py"]
    assert traffic.after_first_eval("read", "call") == []
    # each step's files are written once, a step decided by its round's comparison (it has a note) twice: PENDING
    # as its result arrived, then final; the best's only when it changes; the state once per commit, and at the end
    writes = Counter(traffic.of("write"))
    decided = {s.index for s in steps if s.retime_note}
    assert decided
    step_files = {w: c for w, c in writes.items() if w.startswith("steps/")}
    for name, count in step_files.items():
        rewritten = int(name.split("/")[1]) in decided and name.rsplit("/", 1)[1] in ("step.json", "result.json")
        assert count == (2 if rewritten else 1), name
    assert len([w for w in step_files if w.endswith("step.json")]) == n + 1
    assert writes["state.json"] == n + 2 + len(decided)
    expected = best_writes_expected(store)
    assert writes["best/kernel.py"] == writes["best/result.json"] == writes["best/diff.patch"] == expected
    chunks = traffic.per_step_writes()
    assert len(chunks) == n + 2 + len(decided) and max(len(c) for c in chunks) <= MAX_WRITES_PER_STEP
    assert sum(writes.values()) <= MAX_WRITES_PER_STEP * (n + 1 + len(decided)) + 1


def test_the_trajectory_in_memory_is_the_one_on_disk(make_run, monkeypatch):
    store, loop, traffic, states, final = run_scripted(make_run, monkeypatch, 10)
    mem, disk = loop.trajectory, Trajectory.load(RunStore(store.path))
    assert mem.steps == disk.steps and mem.sources == disk.sources and mem.best == disk.best
    assert mem.usage == disk.usage and mem.best_step == disk.best_step and mem.gpu == disk.gpu
    assert (mem.candidates, mem.streak) == (disk.candidates, disk.streak) == (10, 3)
    assert mem.attempts == disk.attempts
    on_disk = store.state()
    assert on_disk == final and final.steps == 11 and final.best_step == mem.best_step
    assert final.best_geomean_speedup == pytest.approx(store.best()[1].geomean_speedup)


def test_each_step_hears_its_own_state(make_run, monkeypatch):
    """The state is a value replaced each step, never an object patched behind the caller's back."""
    store, loop, traffic, states, final = run_scripted(make_run, monkeypatch, 6)
    assert [s.steps for s in states] == list(range(1, 8))
    assert len({id(s) for s in states}) == len(states) and final is not states[-1]
    assert [s.usage.prompt_tokens for s in states] == [0] + [10 * k for k in (1, 2, 3, 3, 4, 5)]  # c4 has no kernel


def test_a_resumed_run_reads_its_trajectory_once(make_run, monkeypatch):
    sources, times = script(10)
    store, loop = make_run(ScriptedPlanner(sources), ScriptedEvaluator({"starter": [100.0], **times}),
                           max_steps=10, patience=100)
    loop.run()
    finished = len(store.steps())
    # as if killed after saving step 11's proposal, before its result
    store.save_proposal(finished, Proposal(source="pending", idea="try pending"), Language.TRITON)
    more, more_times = script(4, start=finished + 1, best=1.0)  # after the pending kernel's 1 us
    traffic = Traffic(monkeypatch, store.path)
    evaluator = LoggedEvaluator(traffic, {**times, **more_times, "pending": [1.0], "starter": [100.0]})
    resumed = Loop(RunStore(store.path), loop.task, ScriptedPlanner(more), SerialPool(evaluator),
                   Limits(max_steps=15, patience=100))
    state = resumed.run()
    monkeypatch.undo()

    steps = store.steps()
    assert state.status.value == "MAX_STEPS" and len(steps) == 16 and state.steps == 16
    assert steps[finished].idea == "try pending" and steps[finished].outcome is StepOutcome.ACCEPTED
    reads = Counter(traffic.of("read"))
    assert set(reads.values()) == {1}  # every file read once
    assert len([r for r in reads if r.endswith("step.json")]) == finished
    assert Counter(traffic.of("call"))["steps"] == 1 and Counter(traffic.of("call"))["best"] == 1
    assert traffic.after_first_eval("read", "call") == []
    chunks = traffic.per_step_writes()
    decided = sum(1 for s in steps[finished:] if s.retime_note)  # committed PENDING, then final
    assert len(chunks) == 5 + 1 + decided and max(len(c) for c in chunks) <= MAX_WRITES_PER_STEP
    # the pending proposal was saved once, by the killed run: not again
    assert "steps/0011/proposal.json" not in traffic.of("write")
    assert "steps/0011/step.json" in traffic.of("write")
