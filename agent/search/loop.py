"""propose -> evaluate -> record -> accept, until something says stop.

Stop conditions are exceptions. The run is read once, when the loop starts
(trajectory.py); from then on the loop works from memory and writes each step's
files once: its proposal when proposed, then its commit, step.json, which holds
the step's result and any change of the best kernel (one rename: a killed run
resumes by evaluating its uncommitted step again), then the best/ cache when the
best changed, and the run's state.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

from optagent.progress import Phase, Progress, ProgressSink, Subject, stamped
from optagent.protocols import Evaluator, Memory, Planner, PlannerContext, PlannerExhausted, PlannerWaiting
from optagent.schema import BestRef, EvalResult, Proposal, RunState, RunStatus, Step, StepOutcome, now
from optagent.search.store import RunStore
from optagent.search.trajectory import Best, Trajectory
from optagent.task import TaskPackage


class Stop(Exception):
    status = RunStatus.FAILED


class Converged(Stop):
    status = RunStatus.CONVERGED


class MaxSteps(Stop):
    status = RunStatus.MAX_STEPS


class TimeLimit(Stop):
    status = RunStatus.TIME_LIMIT


class Budget(Stop):
    status = RunStatus.BUDGET


class Exhausted(Stop):
    status = RunStatus.EXHAUSTED


class PlannerFailed(Stop):
    status = RunStatus.FAILED


class Waiting(Stop):
    status = RunStatus.WAITING


@dataclass
class Limits:
    min_gain: float = 0.01
    patience: int = 5
    max_steps: int = 50
    time_limit_s: Optional[float] = None
    budget_usd: Optional[float] = None
    # Consecutive planner errors (each already retried by retry.py) that end the run: an endpoint
    # that keeps failing would otherwise fill the run with empty steps until patience ran out.
    planner_failures: int = 3


# A gain this large cannot be timing noise (the same kernel's eager geomean moved 0.5-6% between two
# evaluations on an H200), so it is accepted without re-timing both kernels back to back:
# that re-timing costs two more evaluations, minutes for the slow starters of big packages.
CLEAR_GAIN = 0.25


def _first_line(text: Optional[str], limit: int = 300) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else "(no reason given)"


def noise(result: EvalResult) -> float:
    spreads = [c.time.spread for c in result.timed if c.time]
    return statistics.median(spreads) if spreads else 0.0


class Loop:
    def __init__(self, store: RunStore, task: TaskPackage, planner: Planner, evaluator: Evaluator, limits: Limits,
                 on_step: Callable[[Step, RunState], None] = lambda s, st: None,
                 progress: Optional[ProgressSink] = None, memory: Optional[Memory] = None):
        self.store, self.task, self.planner, self.evaluator = store, task, planner, evaluator
        self.limits, self.on_step, self.progress, self.memory = limits, on_step, progress, memory
        self.config = store.config
        self.started = time.monotonic()
        self.trajectory: Optional[Trajectory] = None  # read in run()
        self._best_changed = False  # by the step being evaluated: committed with its record

    def run(self) -> RunState:
        self.store.remove_leftovers()
        traj = self.trajectory = Trajectory.load(self.store)
        if traj.cache_stale:  # killed between a commit and the best/ cache it changed
            self.store.save_best(traj.best.source, traj.best.result)
        state = self.store.state() or RunState(status=RunStatus.RUNNING, steps=0)
        # the totals follow the steps: a kill between a step's record and the state's leaves the state behind
        state = state.model_copy(update={"status": RunStatus.RUNNING, "reason": None, **self._totals()})
        for index, proposal in traj.unfinished:
            if proposal.source is not None and self.store.step_source(index) is None:  # removed by hand
                self.store.save_candidate(index, proposal.source, self.config.language)
        failures, last_failure = 0, ""  # consecutive planner errors
        try:
            if not traj.steps:
                traj.unfinished = [p for p in traj.unfinished if p[0] != 0]  # the starter is proposed afresh
                state = self._step(0, Proposal(source=traj.starter, idea="the starter kernel"), state, saved=False)
            while True:
                self._check_limits(state)
                if traj.unfinished:  # killed mid-evaluation: evaluate the same proposal again
                    index, proposal = traj.unfinished.pop(0)
                    state = self._step(index, proposal, state, saved=True)
                else:
                    index = traj.next_index
                    if self.progress:
                        self.progress(Progress(phase=Phase.PROPOSING, step=index))
                    try:
                        proposal = self.planner.propose(self._context(index))
                        failures = 0
                    except PlannerWaiting as e:
                        raise Waiting(str(e)) from None
                    except PlannerExhausted as e:
                        raise Exhausted(str(e) or "the planner has nothing more to try") from None
                    except Exception as e:  # an endpoint that fails is a recorded step, not a crash
                        failures, last_failure = failures + 1, f"{type(e).__name__}: {e}"
                        proposal = Proposal(idea="(planner failed)", error=f"planner failed: {last_failure}")
                    state = self._step(index, proposal, state, saved=False)
                if failures >= self.limits.planner_failures:
                    raise PlannerFailed(f"the planner failed {failures} times in a row, last: "
                                        f"{_first_line(last_failure)}")
        except Stop as stop:
            status, reason = stop.status, str(stop)
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            reason = f"stopped by Ctrl-C; optagent resume {self.store.path.name} continues it"
        if status is not RunStatus.INTERRUPTED and traj.best is None:
            status, reason = RunStatus.FAILED, self._nothing_passed(reason)
        state = state.model_copy(update={"status": status, "reason": reason, **self._totals(), "updated_at": now()})
        self.store.save_state(state)
        return state

    def _step(self, index: int, proposal: Proposal, state: RunState, saved: bool) -> RunState:
        if not saved:
            self.store.save_proposal(index, proposal, self.config.language)
        return self._record(self._evaluate(index, proposal), proposal.source, state)

    def _nothing_passed(self, stopped: str) -> str:
        """Why a run without a single passing kernel failed: the starter's verdict first."""
        steps = self.trajectory.steps
        starter = next((s for s in steps if s.index == 0), None)
        if starter is None:
            why = "the starter was not evaluated"
        elif starter.result is not None:
            why = f"the starter failed: {starter.result.status.value}: {_first_line(starter.result.reason)}"
        else:
            why = f"the starter failed: {_first_line(starter.error)}"
        tried = self.trajectory.candidates
        after = f"; nor did the {tried} candidate(s) after it" if tried else ""
        return f"no kernel passed: {why}{after} (stopped: {stopped})"

    def _check_limits(self, state: RunState) -> None:
        done = self.trajectory.candidates
        if done >= self.limits.max_steps:
            raise MaxSteps(f"--max-steps {self.limits.max_steps}: {done} candidate(s) after the starter")
        if self.limits.time_limit_s and time.monotonic() - self.started >= self.limits.time_limit_s:
            raise TimeLimit(f"--time-limit {self.limits.time_limit_s:g} s reached")
        if self.limits.budget_usd is not None and state.usage.cost_usd >= self.limits.budget_usd:
            raise Budget(f"--budget-usd {self.limits.budget_usd:g}: ${state.usage.cost_usd:.2f} spent")
        streak = self.trajectory.streak
        if streak >= self.limits.patience:
            raise Converged(f"no gain >= {self.limits.min_gain:.0%} in {streak} steps")

    def next_context(self) -> PlannerContext:
        """What the planner would be given next (outside agents read it; the run need not be driven)."""
        if self.trajectory is None:
            self.trajectory = Trajectory.load(self.store)
        return self._context(self.trajectory.next_index)

    def _context(self, index: int) -> PlannerContext:
        traj = self.trajectory
        language = self.config.language
        return PlannerContext(
            task_name=self.task.name, title=self.task.title, statement=self.task.statement,
            contract=self.task.contracts.get(language, ""), language=language, starter_source=traj.starter,
            best_source=traj.best.source if traj.best else traj.starter,
            best_result=traj.best.result if traj.best else None,
            attempts=list(traj.attempts), gpu=traj.gpu_facts(), step_index=index,
            memory=self.memory.recall() if self.memory else None)

    def _evaluate(self, index: int, proposal: Proposal) -> Step:
        started = now()
        base = dict(index=index, started_at=started, idea=proposal.idea, usage=proposal.usage)
        if proposal.source is None:
            return Step(**base, finished_at=now(), outcome=StepOutcome.NO_KERNEL, error=proposal.error)
        language = self.config.language
        result = self.evaluator.evaluate(proposal.source, language, progress=stamped(self.progress, step=index))
        sha = result.source_sha256
        best = self.trajectory.best
        if not result.status.ok:
            outcome, note = StepOutcome.FAILED, None
        elif best is None:
            outcome, note = (StepOutcome.BASELINE if index == 0 else StepOutcome.ACCEPTED), None
            self._save_best(proposal.source, result, index)
        else:
            outcome, note, result = self._compare(best, proposal.source, result, index)
        return Step(**base, finished_at=now(), outcome=outcome, candidate_sha256=sha, result=result,
                    retime_note=note, error=result.reason if not result.status.ok else None)

    def _save_best(self, source: str, result: EvalResult, step: Optional[int]) -> None:
        """In memory only: the change is written with the step's commit, in _record."""
        self.trajectory.best = Best(source, result, step)
        self._best_changed = True

    def _compare(self, best: Best, source: str, result: EvalResult, index: int):
        """Noise-aware acceptance: faster by more than the spread, re-timed back to back."""
        best_source, best_result = best.source, best.result
        t_best, t_new = best_result.geomean_time_us, result.geomean_time_us
        gain = t_best / t_new - 1 if t_best and t_new else None
        if gain is None or gain <= self.limits.min_gain:
            return StepOutcome.NOT_BETTER, None, result
        spread = max(noise(best_result), noise(result))
        if gain > max(CLEAR_GAIN, 3 * spread):
            self._save_best(source, result, index)
            return StepOutcome.ACCEPTED, (f"gain {gain:+.1%} over the incumbent's recorded timing, far above the "
                                          f"noise ({spread:.1%}): not re-timed"), result
        language = self.config.language
        again_best = self.evaluator.evaluate(
            best_source, language, progress=stamped(self.progress, step=index, subject=Subject.INCUMBENT_RETIME))
        again_new = self.evaluator.evaluate(
            source, language, progress=stamped(self.progress, step=index, subject=Subject.CANDIDATE_RETIME))
        fresh = bool(again_best.status.ok and again_best.geomean_time_us)
        if not again_new.status.ok:
            outcome, note, kept = StepOutcome.FAILED, "failed when re-timed", again_new
        elif not fresh or not again_new.geomean_time_us:
            outcome, note, kept = StepOutcome.NOT_BETTER, "the incumbent could not be re-timed", result
        else:
            gain = again_best.geomean_time_us / again_new.geomean_time_us - 1
            spread = max(noise(again_best), noise(again_new))
            note = (f"re-timed back to back: incumbent {again_best.geomean_time_us:.1f} us, candidate "
                    f"{again_new.geomean_time_us:.1f} us (geomean), gain {gain:+.1%}, noise {spread:.1%}")
            if gain > max(self.limits.min_gain, spread):
                self._save_best(source, again_new, index)
                return StepOutcome.ACCEPTED, note, again_new
            outcome, kept = StepOutcome.NOT_BETTER, again_new
        if fresh:
            # The incumbent stays; its record becomes this timing, side by side with the candidate's: a
            # record taken on a slow stretch of the host would let a later candidate that is no faster
            # clear CLEAR_GAIN against it unchecked (and shows a best slower than the candidates that lost).
            self._save_best(best_source, again_best, best.step)
        return outcome, note, kept

    def _totals(self) -> dict:
        traj = self.trajectory
        return dict(steps=len(traj.steps), best_step=traj.best_step, usage=traj.usage,
                    best_geomean_speedup=traj.best_speedup)

    def _record(self, step: Step, source: Optional[str], state: RunState) -> RunState:
        """The step's commit (its record, result and any change of the best), then the caches that follow it."""
        traj, changed = self.trajectory, self._best_changed
        self._best_changed = False
        owner = traj.best.step if traj.best and traj.best.step is not None else traj.best_step
        ref = BestRef(step=owner, result=traj.best.result, seq=traj.next_seq) if changed and owner is not None else None
        step = step.model_copy(update={"best_geomean_speedup": traj.best_speedup, "best": ref})
        self.store.save_step(step)
        if self.memory:  # after the commit: a kill in between is repaired by the next run's backfill
            self.memory.record(step)
        if changed:
            self.store.save_best(traj.best.source, traj.best.result)
        traj.add(step, source)
        state = state.model_copy(update={**self._totals(), "updated_at": now()})
        self.store.save_state(state)
        self.on_step(step, state)
        return state
