"""Rounds of width K: a scripted planner with known outcomes, a counting Pool, the tree and its lineage,
the CPU accept rule, and a crash mid-round then resume."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from optagent.cli.main import main
from optagent.evaluation.serial_pool import SerialPool
from optagent.protocols import PlannerExhausted
from optagent.runs.view import PlannerContext
from optagent.schema import Language, Proposal, RunConfig, RunStatus, Status, StepOutcome, Usage
from optagent.runs import files as run_files
from optagent.search.loop import Limits, Loop
from optagent.runs.store import RunStore, new_run_id
from optagent.task import load_task
from test_loop import ScriptedEvaluator  # noqa: E402  (tests/ is on sys.path under pytest)
from tiny_package import FAST, tiny_package

# Round 1 (steps 1-3, all from the starter): a and c gain less than CLEAR_GAIN, so both are re-timed with the
# starter once, and c, faster re-timed, wins; b fails. Round 2 (from c and two others): d gains 37% outright
# and wins unchecked, e's 1% loses to it, f is slower. Round 3 is cut to one candidate by --max-steps 7:
# g gains 10% over d and is accepted after a re-time.
PLAN = {1: "a", 2: "b", 3: "c", 4: "d", 5: "e", 6: "f", 7: "g"}
TIMES = {"starter": [100.0], "a": [90.0, 88.0], "b": [Status.COMPILE_ERROR], "c": [85.0, 80.0], "d": [50.0],
         "e": [79.0], "f": [120.0], "g": [45.0]}
OUTCOMES = [StepOutcome.BASELINE, StepOutcome.NOT_BETTER, StepOutcome.FAILED, StepOutcome.ACCEPTED,
            StepOutcome.ACCEPTED, StepOutcome.NOT_BETTER, StepOutcome.NOT_BETTER, StepOutcome.ACCEPTED]


class IndexPlanner:
    """Proposes by step index (so a resumed run goes on as the killed one would have); keeps every context."""

    name, model = "scripted", None

    def __init__(self, plan: dict = PLAN):
        self.plan, self.contexts = plan, []

    def propose(self, ctx: PlannerContext) -> Proposal:
        self.contexts.append(ctx)
        if ctx.step_index not in self.plan:
            raise PlannerExhausted("done")
        src = self.plan[ctx.step_index]
        return Proposal(source=src, idea=f"try {src}", usage=Usage(prompt_tokens=10))


class CountingPool(SerialPool):
    """The serial pool, counting its calls; ``reverse`` yields a round's results last job first."""

    def __init__(self, evaluator, reverse: bool = False):
        super().__init__(evaluator)
        self.reverse, self.rounds, self.retimes = reverse, [], []

    def evaluate(self, jobs, progress=None):
        self.rounds.append([j.key for j in jobs])
        yield from super().evaluate(list(reversed(jobs)) if self.reverse else jobs, progress)

    def retime(self, jobs, progress=None):
        self.retimes.append([j.key for j in jobs])
        return super().retime(jobs, progress)


def times() -> dict:
    return {k: list(v) for k, v in TIMES.items()}


def new_store(root: Path, task_dir: Path, width: int = 3, max_steps: int = 7, device: str = "cuda") -> RunStore:
    cfg = RunConfig(run_id=new_run_id("t"), task_dir=str(task_dir), task_name="flashattn_decode", task_digest="x",
                    language=Language.TRITON, device=device, planner="offline", timeout_s=10, min_gain=0.01,
                    patience=100, max_steps=max_steps, width=width)
    return RunStore.create(root, cfg, "starter")


@functools.lru_cache(maxsize=None)
def task_of(task_dir: Path):
    return load_task(task_dir)


def drive(store: RunStore, task_dir: Path, pool, planner=None, width: int = 3, max_steps: int = 7, patience=100):
    loop = Loop(RunStore(store.path), task_of(task_dir), planner or IndexPlanner(), pool,
                Limits(max_steps=max_steps, patience=patience, width=width))
    return loop.run(), loop


@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "out-of-order"])
def test_rounds_of_three_accept_the_right_steps_and_retime_once_a_round(tmp_path, task_dir, reverse):
    store = new_store(tmp_path, task_dir)
    pool, planner = CountingPool(ScriptedEvaluator(times()), reverse=reverse), IndexPlanner()
    state, _ = drive(store, task_dir, pool, planner)
    steps = store.steps()
    assert state.status is RunStatus.MAX_STEPS and state.steps == 8  # 7 candidates: --max-steps counts them
    assert [s.outcome for s in steps] == OUTCOMES
    assert pool.rounds == [[0], [1, 2, 3], [4, 5, 6], [7]]  # the last round cut to what --max-steps left
    assert pool.retimes == [[0, 1, 3], [4, 7]]  # the incumbent first, once a round; none where d won outright
    assert [s.round for s in steps] == [0, 1, 1, 1, 2, 2, 2, 3]
    parents = [s.parent for s in steps]
    assert parents[:5] == [None, 0, 0, 0, 3] and parents[7] == 4
    assert sorted(parents[5:7]) == [0, 1]  # the other slots explore: the starter, and a (passed, not the best)
    assert "step 3 gained more" in steps[1].retime_note and "step 4 gained more" in steps[5].retime_note
    assert "not re-timed" in steps[4].retime_note and "re-timed back to back" in steps[7].retime_note
    source, result = store.best()
    assert source == "g" and state.best_step == 7 and steps[-1].best.step == 7
    # each slot's context starts from its parent's kernel, with the lineage and siblings of that parent
    ctx = {c.step_index: c for c in planner.contexts}
    assert [c.parent_step for c in (ctx[1], ctx[2], ctx[3])] == [0, 0, 0]
    assert ctx[4].best_source == "c" and ctx[4].incumbent_step == 3 and ctx[4].slot == 0 and ctx[4].width == 3
    assert [a.index for a in ctx[4].lineage] == [0, 3] and ctx[4].siblings == []  # c has no children yet
    other = ctx[5] if ctx[5].parent_step == 1 else ctx[6]
    assert other.best_source == "a" and other.incumbent_step == 3 and [a.index for a in other.lineage] == [0, 1]
    root = ctx[5] if ctx[5].parent_step == 0 else ctx[6]
    assert [(a.index, a.outcome) for a in root.siblings] == [(1, "NOT_BETTER"), (2, "FAILED"), (3, "ACCEPTED")]
    assert sorted(ctx[5].round_parents) == sorted(ctx[6].round_parents) == [0, 1, 3]
    assert [a.index for a in ctx[7].lineage] == [0, 3, 4] and ctx[7].width == 1


def test_width_one_keeps_the_search_on_the_incumbent(tmp_path, task_dir):
    store = new_store(tmp_path, task_dir, width=1)
    pool = CountingPool(ScriptedEvaluator(times()))
    drive(store, task_dir, pool, width=1)
    steps = store.steps()
    assert pool.rounds == [[i] for i in range(8)]
    best_so_far, expected = 0, []
    for s in steps[1:]:
        expected.append(best_so_far)
        if s.outcome is StepOutcome.ACCEPTED:
            best_so_far = s.index
    assert [s.parent for s in steps[1:]] == expected


def test_on_the_cpu_a_faster_timing_never_replaces_the_best(tmp_path, task_dir):
    plan = {1: "fast", 2: "broken", 3: "faster"}
    ev = ScriptedEvaluator({"starter": [100.0], "fast": [10.0], "broken": [Status.COMPILE_ERROR],
                            "faster": [1.0]}, device="cpu")
    store = new_store(tmp_path, task_dir, device="cpu")
    pool = CountingPool(ev)
    state, _ = drive(store, task_dir, pool, IndexPlanner(plan))
    steps = store.steps()
    assert [s.outcome for s in steps] == [StepOutcome.BASELINE, StepOutcome.PASSED, StepOutcome.FAILED,
                                          StepOutcome.PASSED]
    assert store.best()[0] == "starter" and state.best_step == 0 and pool.retimes == []
    # passing kernels are nodes of the tree: the next round's slots start from them
    assert {s.parent for s in steps[1:]} == {0}


def test_on_the_cpu_the_first_kernel_that_passed_is_the_best_and_patience_counts_from_it(tmp_path, task_dir):
    plan = {1: "ok", 2: "quick", 3: "bad1", 4: "bad2", 5: "never"}
    ev = ScriptedEvaluator({"starter": [Status.RUNTIME_ERROR], "ok": [50.0], "quick": [5.0],
                            "bad1": [Status.INCORRECT], "bad2": [Status.INCORRECT], "never": [1.0]}, device="cpu")
    store = new_store(tmp_path, task_dir, width=1, device="cpu")
    state, _ = drive(store, task_dir, SerialPool(ev), IndexPlanner(plan), width=1, patience=2)
    # "quick" passes and is faster, yet the best stays "ok"; patience 2 counts "quick" and "bad1"
    assert [s.outcome for s in store.steps()] == [StepOutcome.FAILED, StepOutcome.ACCEPTED, StepOutcome.PASSED,
                                                  StepOutcome.FAILED]
    assert state.status is RunStatus.CONVERGED and store.best()[0] == "ok"


class Crash(BaseException):
    """A kill: nothing in the loop catches it."""


def test_a_crash_mid_round_resumes_evaluating_only_the_unfinished(tmp_path, task_dir):
    store = new_store(tmp_path, task_dir)
    ev = ScriptedEvaluator(times())

    class Dies(SerialPool):
        def evaluate(self, jobs, progress=None):
            for k, got in enumerate(super().evaluate(jobs, progress)):
                yield got
                if got[0].key == 2:
                    raise Crash("killed after step 2's result, before step 3's")

    with pytest.raises(Crash):
        drive(store, task_dir, Dies(ev))
    done = {s.index: s for s in store.steps()}
    assert sorted(done) == [0, 1, 2] and done[1].outcome is StepOutcome.PENDING  # decided with its round
    assert [i for i, _ in store.unfinished_steps()] == [3]
    ev.calls.clear()
    pool = CountingPool(ev)
    state, _ = drive(store, task_dir, pool)
    assert pool.rounds[0] == [3] and ev.calls[:1] == ["c"]  # a and b are not evaluated again
    assert pool.retimes[0] == [0, 1, 3]  # the round's comparison still covers step 1
    assert [s.outcome for s in store.steps()] == OUTCOMES and state.status is RunStatus.MAX_STEPS


def test_a_crash_before_any_write_of_a_round_resumes_consistently(tmp_path, task_dir, monkeypatch):
    """Fault injection over a run of rounds: killed before each write in turn, then resumed."""
    monkeypatch.setattr("os.fsync", lambda fd: None)  # the order of the writes is tested, not durability
    ref = new_store(tmp_path / "ref", task_dir)
    real, calls = run_files.atomic_write, []
    monkeypatch.setattr(run_files, "atomic_write", lambda p, t: (calls.append(p), real(p, t)))
    drive(ref, task_dir, SerialPool(ScriptedEvaluator(times())))
    total = len(calls)
    for k in range(1, total + 1, 2):  # every other write: each kind of write is hit, at a third of the cost
        store = new_store(tmp_path / f"k{k}", task_dir)
        ev, seen = ScriptedEvaluator(times()), []

        def write(p: Path, text: str, k=k) -> None:
            seen.append(p)
            if len(seen) == k:
                raise Crash(f"killed before writing {p}")
            real(p, text)

        monkeypatch.setattr(run_files, "atomic_write", write)
        with pytest.raises(Crash):
            drive(store, task_dir, SerialPool(ev))
        monkeypatch.setattr(run_files, "atomic_write", real)
        killed = seen[-1]
        # a kill while a round's proposals were being saved, after the first: the resumed round is smaller
        cut = killed.name in ("candidate.py", "proposal.json") and any(
            i < int(killed.parent.name) for i, _ in store.unfinished_steps())
        state, _ = drive(store, task_dir, SerialPool(ev))  # shared: a re-time follows on from the first timing
        steps = store.steps()
        assert [s.index for s in steps] == list(range(8)) and store.unfinished_steps() == []
        assert state.status is RunStatus.MAX_STEPS and state.steps == 8
        assert StepOutcome.PENDING not in {s.outcome for s in steps}
        ref_best = max((s.best for s in steps if s.best), key=lambda b: b.seq)
        assert store.best() == (store.step_source(ref_best.step), ref_best.result) and state.best_step == ref_best.step
        if not cut:  # else a run still whole, with other rounds
            assert [s.outcome for s in steps] == OUTCOMES, (k, killed)
            assert store.best()[0] == "g"


def test_lineage_of_the_best_in_show_report_and_leaderboard(tmp_path, task_dir, capsys):
    store = new_store(tmp_path, task_dir)
    drive(store, task_dir, SerialPool(ScriptedEvaluator(times())))
    run_id = store.config.run_id
    assert main(["show", run_id, "--runs-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "lineage of the best (step 7): 0 the starter kernel > 3 try c > 4 try d > 7 try g" in shown
    page = tmp_path / "page.html"
    assert main(["report", run_id, "--runs-dir", str(tmp_path), "-o", str(page), "--quiet"]) == 0
    html = page.read_text()
    assert 'Lineage, from the starter to the best kernel' in html
    assert [f'href="#step-{i}"' in html.split("Lineage,")[1].split("</p>")[0] for i in (0, 3, 4, 7)] == [True] * 4
    assert main(["leaderboard", "--runs-dir", str(tmp_path)]) == 0
    assert "0>3>4>7" in capsys.readouterr().out
    board = tmp_path / "board.html"
    assert main(["leaderboard", "--runs-dir", str(tmp_path), "--html", str(board)]) == 0
    assert ">0&gt;3&gt;4&gt;7</td>" in board.read_text()
    capsys.readouterr()
    assert main(["leaderboard", "--runs-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["lineage"] == [0, 3, 4, 7]


def test_kill_9_mid_round_then_resume_evaluates_only_the_unfinished(tmp_path):
    """The real CLI on the CPU: a round of 3 replies (one an edit that does not apply), killed once 2 of its
    3 steps are committed. On the tiny package (seconds per evaluation); the third reply's kernel launches
    itself hundreds of times a call, so that it is still in flight when the other two are committed (with
    three alike, a loaded host let the poll see 1 and then 3)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    task_dir = tiny_package(tmp_path / "pkg")
    runs, replay = tmp_path / "runs", tmp_path / "replay.jsonl"
    kernel = "IDEA: {idea}\n\n```python\n{code}```\n"
    replay.write_text("".join(json.dumps({"reply": r}) + "\n" for r in (
        kernel.format(idea="one program per 4096 elements", code=FAST),
        "IDEA: one program per 64 elements\n\n<<<<<<< SEARCH\nBLOCK=64)\n=======\nBLOCK=128)\n>>>>>>> REPLACE\n",
        kernel.format(idea="one program per 1024 elements, launched 200 times", code=FAST.replace(
            "BLOCK = 4096", "BLOCK = 1024").replace("    _affine_wide[", "    for _ in range(200):\n        _affine_wide[")))))
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(runs)}
    env.pop("OPTAGENT_BASE_URL", None)
    cli = [sys.executable, "-m", "optagent.cli.main"]
    proc = subprocess.Popen(cli + ["run", str(task_dir), "--planner", "replay", "--replay", str(replay), "--no-hidden",
                                   "--width", "3"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 400
    committed: list[Path] = []
    while time.monotonic() < deadline and len(committed) < 2 and proc.poll() is None:
        committed = [p for p in runs.glob("*/steps/000[123]/step.json")]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(committed) == 2, "the round never had 2 committed steps"
    (run,) = [p for p in runs.iterdir() if (p / "config.json").exists()]
    store = RunStore(run)
    # the pool evaluates the round's steps at once: any 2 of the 3 may be the committed ones, and on a
    # loaded host the third may commit between the poll that saw 2 and the kill (then nothing is left)
    done = sorted(s.index for s in store.steps())
    left = [i for i, _ in store.unfinished_steps()]
    assert done[0] == 0 and len(done) >= 3 and len(done) + len(left) == 4 and sorted(done[1:] + left) == [1, 2, 3]
    before = {i: (store.step_dir(i) / "step.json").read_bytes() for i in done[1:]}

    resumed = subprocess.run(cli + ["resume", run.name], env=env, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert {i: (store.step_dir(i) / "step.json").read_bytes() for i in done[1:]} == before  # not evaluated again
    steps = store.steps()
    assert [s.index for s in steps] == [0, 1, 2, 3] and store.unfinished_steps() == []
    assert [s.round for s in steps] == [0, 1, 1, 1] and [s.parent for s in steps] == [None, 0, 0, 0]
    assert len({s.idea for s in steps}) == 4 and store.state().status is RunStatus.EXHAUSTED
    assert steps[3].result is not None and store.config.width == 3
    # on the CPU nothing replaces the starter on a timing: the passing candidates are tree nodes
    assert {s.outcome for s in steps[1:]} <= {StepOutcome.PASSED, StepOutcome.FAILED, StepOutcome.NO_KERNEL}
    assert store.best()[0] == store.starter
