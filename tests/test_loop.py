"""The loop's rules with a scripted evaluator: acceptance, stop conditions, recording."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from optagent.evaluation.serial_pool import SerialPool
from optagent.search.knobs import find_knobs, set_knobs
from optagent.search.loop import Limits, Loop
from optagent.search.planners.offline import OfflinePlanner
from optagent.search.strategy_spec import run_kernel_params
from optagent.protocols import PlannerExhausted
from optagent.runs.view import PlannerContext
from optagent.schema import (CaseKind, CaseResult, EvalResult, Language, Proposal, RunConfig, RunState, RunStatus,
                             Status, StepOutcome, Timing, Usage)
from optagent.runs.store import RunStore, new_run_id
from optagent.task import load_task


def result(source: str, time_us: float | None, spread: float = 0.0, status: Status = Status.PASSED,
           device: str = "cuda") -> EvalResult:
    """A GPU result unless ``device`` says cpu: acceptance on a timing happens only on a GPU."""
    sha = hashlib.sha256(source.encode()).hexdigest()
    if status is not Status.PASSED:
        return EvalResult(status=status, reason="scripted failure", language=Language.TRITON, device=device,
                          source_sha256=sha, wall_s=0.0)
    t = Timing(median_us=time_us, p10_us=time_us * (1 - spread), p90_us=time_us * (1 + spread), samples=10)
    case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time=t, time_us=time_us,
                      baseline_us=100.0, rel_err=1e-3)
    return EvalResult(status=Status.PASSED, language=Language.TRITON, device=device, source_sha256=sha,
                      cases=[case], wall_s=0.0)


class ScriptedEvaluator:
    """Times per source; a list gives successive timings (first evaluation, then re-times)."""

    def __init__(self, times: dict[str, list], spread: float = 0.0, device: str = "cuda"):
        self.times, self.spread, self.calls, self.device = times, spread, [], device

    def evaluate(self, source: str, language: Language, progress=None) -> EvalResult:
        self.calls.append(source)
        seq = self.times[source]
        value = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(value, Status):
            return result(source, None, status=value, device=self.device)
        return result(source, value, self.spread, device=self.device)


class ScriptedPlanner:
    name, model = "scripted", None

    def __init__(self, sources: list[str], cost: float = 0.0):
        self.sources, self.cost, self.contexts = list(sources), cost, []

    def propose(self, ctx: PlannerContext) -> Proposal:
        self.contexts.append(ctx)
        if not self.sources:
            raise PlannerExhausted("done")
        src = self.sources.pop(0)
        if src is None:
            return Proposal(idea="nothing", error="reply held no kernel", usage=Usage(cost_usd=self.cost))
        return Proposal(source=src, idea=f"try {src}", usage=Usage(prompt_tokens=10, cost_usd=self.cost))


@pytest.fixture
def make_run(tmp_path, task_dir):
    task = load_task(task_dir)

    def make(planner, evaluator, **limits):
        cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name,
                        task_digest="x", language=Language.TRITON, device="cpu", planner="offline",
                        timeout_s=10, min_gain=limits.get("min_gain", 0.01), patience=limits.get("patience", 5),
                        max_steps=limits.get("max_steps", 50))
        store = RunStore.create(tmp_path / "runs", cfg, "starter")
        return store, Loop(store, task, planner, SerialPool(evaluator), Limits(**limits))
    return make


def test_faster_candidate_is_accepted_after_back_to_back_retime(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "fast": [85.0]})
    store, loop = make_run(ScriptedPlanner(["fast"]), ev)
    state = loop.run()
    assert state.status is RunStatus.EXHAUSTED
    steps = store.steps()
    assert [s.outcome for s in steps] == [StepOutcome.BASELINE, StepOutcome.ACCEPTED]
    assert ev.calls == ["starter", "fast", "starter", "fast"]  # the retime ran both again
    assert "re-timed back to back" in steps[1].retime_note
    assert store.best()[0] == "fast"
    assert (store.path / "best" / "diff.patch").read_text().count("+fast") == 1


def test_a_gain_far_above_noise_is_accepted_without_retime(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "fast": [50.0]}, spread=0.05)
    store, loop = make_run(ScriptedPlanner(["fast"]), ev)
    loop.run()
    step = store.steps()[1]
    assert step.outcome is StepOutcome.ACCEPTED and ev.calls == ["starter", "fast"]
    assert "not re-timed" in step.retime_note and store.best()[0] == "fast"
    # the same gain with a 40% spread is within reach of noise (3 x spread): re-timed, and lost
    ev = ScriptedEvaluator({"starter": [100.0], "fast": [50.0, 90.0]}, spread=0.4)
    store, loop = make_run(ScriptedPlanner(["fast"]), ev)
    loop.run()
    assert ev.calls == ["starter", "fast", "starter", "fast"]
    assert store.steps()[1].outcome is StepOutcome.NOT_BETTER and store.best()[0] == "starter"


def test_a_retimed_incumbent_keeps_its_new_timing_never_one_below_its_judged(make_run):
    """A re-time's process can tell it is one (it runs no checked run): the incumbent judged at 100 us and
    re-timed at 50 (a kernel that skips its work when it is not checked) stays at 100; one re-timed slower
    than it was judged (a fast stretch of the host then) keeps the slower, fresh figure as the bar."""
    ev = ScriptedEvaluator({"starter": [100.0, 50.0], "a": [98.0, 99.5]})
    store, loop = make_run(ScriptedPlanner(["a"]), ev)
    loop.run()
    assert ev.calls == ["starter", "a", "starter", "a"]
    assert store.steps()[1].outcome is StepOutcome.NOT_BETTER and "incumbent 100.0 us" in store.steps()[1].retime_note
    source, record = store.best()
    assert source == "starter" and record.geomean_time_us == pytest.approx(100.0)
    ev = ScriptedEvaluator({"starter": [100.0, 120.0], "a": [98.0, 121.0]})
    store, loop = make_run(ScriptedPlanner(["a"]), ev)
    loop.run()
    source, record = store.best()
    assert source == "starter" and record.geomean_time_us == pytest.approx(120.0)
    assert store.steps()[0].result.geomean_time_us == pytest.approx(100.0)  # the step's own record is kept


def test_gain_within_noise_is_not_accepted(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "same": [90.0, 95.0]}, spread=0.2)
    store, loop = make_run(ScriptedPlanner(["same"]), ev)
    loop.run()
    assert store.steps()[1].outcome is StepOutcome.NOT_BETTER
    assert store.best()[0] == "starter"


def test_small_gain_skips_the_retime(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "meh": [99.5]})
    store, loop = make_run(ScriptedPlanner(["meh"]), ev)
    loop.run()
    assert store.steps()[1].outcome is StepOutcome.NOT_BETTER and ev.calls == ["starter", "meh"]


def test_patience_stops_the_run(make_run):
    sources = [f"slow{i}" for i in range(10)]
    ev = ScriptedEvaluator({"starter": [100.0], **{s: [120.0] for s in sources}})
    store, loop = make_run(ScriptedPlanner(sources), ev, patience=3)
    state = loop.run()
    assert state.status is RunStatus.CONVERGED and state.steps == 4


def test_failures_and_empty_replies_are_recorded_steps(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "broken": [Status.COMPILE_ERROR]})
    store, loop = make_run(ScriptedPlanner(["broken", None]), ev)
    loop.run()
    steps = store.steps()
    assert [s.outcome for s in steps] == [StepOutcome.BASELINE, StepOutcome.FAILED, StepOutcome.NO_KERNEL]
    assert steps[2].error == "reply held no kernel"


def test_max_steps_and_budget(make_run):
    sources = [f"s{i}" for i in range(10)]
    ev = ScriptedEvaluator({"starter": [100.0], **{s: [100.0 - i] for i, s in enumerate(sources)}})
    store, loop = make_run(ScriptedPlanner(sources), ev, max_steps=2)
    assert loop.run().status is RunStatus.MAX_STEPS
    ev2 = ScriptedEvaluator({"starter": [100.0], **{s: [120.0] for s in sources}})
    store2, loop2 = make_run(ScriptedPlanner(list(sources), cost=0.4), ev2, budget_usd=1.0)
    state = loop2.run()
    assert state.status is RunStatus.BUDGET and state.usage.cost_usd >= 1.0 and state.steps == 4



def test_a_round_is_cut_to_what_the_budget_still_pays_for(make_run):
    """Round 1 (3 wide, nothing known) spends $1.20; at $0.40 a step, $0.80 left pays for 2, not 3."""
    sources = [f"s{i}" for i in range(10)]
    ev = ScriptedEvaluator({"starter": [100.0], **{s: [120.0] for s in sources}})
    store, loop = make_run(ScriptedPlanner(sources, cost=0.4), ev, budget_usd=2.0, width=3)
    state = loop.run()
    assert state.status is RunStatus.BUDGET and state.steps == 6  # the starter and 5 candidates
    assert abs(state.usage.cost_usd - 2.0) < 1e-9  # not $2.40: the second round was 2 wide
    assert [s.round for s in store.steps()[1:]] == [1, 1, 1, 2, 2]


def test_max_steps_counts_candidates_after_the_starter_not_retimes(make_run):
    # "a" is within re-timing reach, so its step evaluates both kernels again: still one step
    ev = ScriptedEvaluator({"starter": [100.0], "a": [90.0], "b": [80.0]})
    store, loop = make_run(ScriptedPlanner(["a", "b"]), ev, max_steps=1)
    state = loop.run()
    assert state.status is RunStatus.MAX_STEPS and [s.index for s in store.steps()] == [0, 1]
    assert ev.calls == ["starter", "a", "starter", "a"] and "--max-steps 1" in state.reason
    ev = ScriptedEvaluator({"starter": [100.0], "a": [90.0]})
    store, loop = make_run(ScriptedPlanner(["a"]), ev, max_steps=0)
    assert loop.run().status is RunStatus.MAX_STEPS and ev.calls == ["starter"] and len(store.steps()) == 1


def test_a_run_in_which_nothing_passed_fails_with_the_starters_reason(make_run):
    ev = ScriptedEvaluator({"starter": [Status.COMPILE_ERROR], "a": [Status.INCORRECT], "b": [Status.COMPILE_ERROR]})
    store, loop = make_run(ScriptedPlanner(["a", "b"]), ev)
    state = loop.run()
    assert state.status is RunStatus.FAILED and store.best() is None and len(store.steps()) == 3
    assert state.reason.startswith("no kernel passed: the starter failed: COMPILE_ERROR: scripted failure")
    assert "nor did the 2 candidate(s) after it" in state.reason and "(stopped: done)" in state.reason
    assert store.state().reason == state.reason  # on disk too
    # the same when patience or max steps end it
    ev = ScriptedEvaluator({"starter": [Status.COMPILE_ERROR], **{f"x{i}": [Status.COMPILE_ERROR] for i in range(9)}})
    store, loop = make_run(ScriptedPlanner([f"x{i}" for i in range(9)]), ev, patience=2)
    state = loop.run()
    assert state.status is RunStatus.FAILED and "no gain" in state.reason and len(store.steps()) == 3


def test_a_failed_starter_can_still_be_fixed_by_a_candidate(make_run):
    ev = ScriptedEvaluator({"starter": [Status.COMPILE_ERROR], "fixed": [80.0]})
    store, loop = make_run(ScriptedPlanner(["fixed"]), ev)
    state = loop.run()
    assert state.status is RunStatus.EXHAUSTED and state.reason == "done"
    assert [s.outcome for s in store.steps()] == [StepOutcome.FAILED, StepOutcome.ACCEPTED]
    assert store.best()[0] == "fixed" and state.best_step == 1


class FlakyPlanner(ScriptedPlanner):
    """An exception in the script is raised, as an LLM planner raises once retry.py gives up."""

    def propose(self, ctx: PlannerContext) -> Proposal:
        if self.sources and isinstance(self.sources[0], BaseException):
            self.contexts.append(ctx)
            raise self.sources.pop(0)
        return super().propose(ctx)


def test_a_planner_that_keeps_failing_ends_the_run_failed(make_run):
    down = [ConnectionError(f"refused {i}") for i in range(10)]
    ev = ScriptedEvaluator({"starter": [100.0]})
    store, loop = make_run(FlakyPlanner(down), ev)
    state = loop.run()
    assert state.status is RunStatus.FAILED and len(store.steps()) == 4  # the starter, then three failures
    assert state.reason == "the planner failed 3 times in a row, last: ConnectionError: refused 2"
    assert all(s.outcome is StepOutcome.NO_KERNEL for s in store.steps()[1:])
    assert store.best()[0] == "starter"  # what passed is kept


def test_planner_failures_must_be_consecutive(make_run):
    script = [ConnectionError("a"), ConnectionError("b"), "ok", ConnectionError("c"), ConnectionError("d")]
    ev = ScriptedEvaluator({"starter": [100.0], "ok": [120.0]})
    store, loop = make_run(FlakyPlanner(script), ev, patience=10)
    state = loop.run()
    assert state.status is RunStatus.EXHAUSTED and len(store.steps()) == 6


def test_an_interrupted_run_stays_interrupted_even_with_nothing_passed(make_run):
    ev = ScriptedEvaluator({"starter": [Status.COMPILE_ERROR]})
    store, loop = make_run(FlakyPlanner([KeyboardInterrupt()]), ev)
    state = loop.run()
    assert state.status is RunStatus.INTERRUPTED and store.state().status is RunStatus.INTERRUPTED


def test_state_files_written_before_the_reason_existed_still_read():
    old = '{"format_version": 1, "status": "CONVERGED", "steps": 3, "best_step": 1, "best_geomean_speedup": 1.5}'
    state = RunState.model_validate_json(old)
    assert state.status is RunStatus.CONVERGED and state.reason is None

def test_planner_sees_best_and_attempts(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "fast": [50.0], "x": [Status.INCORRECT]})
    planner = ScriptedPlanner(["fast", "x", "y"])
    ev.times["y"] = [60.0]
    store, loop = make_run(planner, ev)
    loop.run()
    ctx = planner.contexts[2]
    assert ctx.best_source == "fast" and ctx.best_result.geomean_time_us == pytest.approx(50.0)
    assert [a.outcome for a in ctx.attempts] == ["BASELINE", "ACCEPTED", "FAILED"]
    assert ctx.attempts[2].error == "scripted failure" and ctx.attempts[1].source == "fast"


def test_resume_reevaluates_an_unfinished_step(make_run):
    ev = ScriptedEvaluator({"starter": [100.0], "a": [50.0], "b": [40.0]})
    store, loop = make_run(ScriptedPlanner(["a"]), ev)
    loop.run()
    # As if killed after saving step 2's proposal but before its result:
    store.save_proposal(2, Proposal(source="b", idea="try b"), Language.TRITON)
    planner = ScriptedPlanner([])
    loop2 = Loop(store, loop.task, planner, SerialPool(ev), Limits())
    loop2.run()
    steps = store.steps()
    assert [s.index for s in steps] == [0, 1, 2] and steps[2].idea == "try b"
    assert store.best()[0] == "b"


STARTER = '''import triton
BLOCK_N = 16  # knob: 16, 32, 64
SPLITS = 4
def run_kernel(q, k, out):
    kern[(1,)](q, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
'''


def test_knobs_found_and_set():
    knobs = {k.name: k for k in find_knobs(STARTER)}
    assert knobs["BLOCK_N"].values == (16, 32, 64)
    assert knobs["SPLITS"].values == (2, 4, 8)
    assert 8 in knobs["num_warps"].values and knobs["num_stages"].value == 2
    changed = set_knobs(STARTER, {"BLOCK_N": 64, "num_warps": 8})
    assert "BLOCK_N = 64  # knob" in changed and "num_warps=8" in changed
    with pytest.raises(KeyError):
        set_knobs(STARTER, {"NOPE": 1})


def test_a_declared_knob_may_end_in_a_note():
    """A note after the value list (as a planner or a person writes them) keeps the knob declared:
    before, the whole line stopped being a knob, and setting it was a KeyError."""
    cuda = ("#define DEEP_UNROLL 4  // knob: 1, 2, 4 (tokens a stream takes per step)\n"
            "#define STAGES 3  // knob: 2, 3, 4\n#define ROWS 8  // knob: 4, 8, - note\n")
    py = "BLOCK_N = 16  # knob: 16, 32, 64  rows per program\n"
    knobs = {k.name: k for k in find_knobs(cuda + py)}
    assert knobs["DEEP_UNROLL"].values == (1, 2, 4) and knobs["STAGES"].values == (2, 3, 4)
    assert knobs["ROWS"].values == (4, 8) and knobs["BLOCK_N"].values == (16, 32, 64)
    assert "#define DEEP_UNROLL 2  // knob: 1, 2, 4 (tokens" in set_knobs(cuda, {"DEEP_UNROLL": 2})


def test_hardware_sizes_are_not_knobs():
    cuda = "#define WARP_SIZE 32\n#define THREADS 128\n#define BLOCK_TOKENS 64\n"
    assert [k.name for k in find_knobs(cuda)] == ["THREADS", "BLOCK_TOKENS"]


def test_offline_planner_walks_knobs_then_stops():
    planner = OfflinePlanner(Language.TRITON, family=None, params=run_kernel_params(STARTER))
    assert run_kernel_params(STARTER) == ["q", "k", "out"]
    ctx = PlannerContext("t", "t", "", "", Language.TRITON, STARTER, STARTER, None)
    seen = set()
    from optagent.runs.view import Attempt

    for i in range(1, 100):
        try:
            p = planner.propose(ctx)
        except PlannerExhausted:
            break
        assert p.source not in seen
        seen.add(p.source)
        ctx.attempts.append(Attempt(i, p.idea, "NOT_BETTER", None, None, p.source))
    assert len(seen) == len({set_knobs(STARTER, {k.name: v}) for k in find_knobs(STARTER)
                             for v in k.values if v != k.value})


def test_offline_planner_finds_strategies_for_the_decode_family(task_dir):
    task = load_task(task_dir)
    planner = OfflinePlanner(Language.TRITON, task.manifest.family, run_kernel_params(task.starter(Language.TRITON).source))
    if not Path(planner.strategies[0].source if planner.strategies else "").name and not planner.strategies:
        pytest.skip("no strategies in the library yet")
    ctx = PlannerContext("t", "t", "", "", Language.TRITON, "starter", "starter", None)
    assert planner.propose(ctx).idea.startswith("strategy ")


def test_resume_reevaluates_an_unfinished_step_behind_the_last(make_run):
    """A step record lost behind later ones (a hand edit) is evaluated again in its place; the totals and
    the next index follow the steps, and a candidate file lost with it is written back from the proposal."""
    from optagent.runs.trajectory import Trajectory

    ev = ScriptedEvaluator({"starter": [100.0], "a": [50.0], "b": [120.0], "c": [130.0], "d": [140.0]})
    store, loop = make_run(ScriptedPlanner(["a", "b", "c"]), ev)
    loop.run()
    (store.step_dir(2) / "step.json").unlink()
    (store.step_dir(2) / "result.json").unlink()
    (store.step_dir(2) / "candidate.py").unlink()
    assert store.unfinished()[0] == 2
    loop2 = Loop(store, loop.task, ScriptedPlanner(["d"]), SerialPool(ev), Limits())
    state = loop2.run()
    steps = store.steps()
    assert [s.index for s in steps] == [0, 1, 2, 3, 4] and steps[2].idea == "try b" and steps[4].idea == "try d"
    assert store.step_source(2) == "b" and store.unfinished() is None
    assert state.steps == 5 and state.best_step == 1 and state.usage.prompt_tokens == 40
    mem, disk = loop2.trajectory, Trajectory.load(store)
    assert [s.index for s in mem.steps] == [0, 1, 2, 3, 4] and mem.steps == disk.steps
    assert mem.sources == disk.sources and mem.streak == disk.streak == 3 and mem.usage == disk.usage
