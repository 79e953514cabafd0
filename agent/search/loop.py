"""propose -> evaluate -> record -> accept, until something says stop.

Stop conditions are exceptions; the trajectory is saved after every step, and
a step is recorded only once its evaluation is complete, so a killed run
resumes by evaluating its unfinished step again.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

from optagent.progress import Phase, Progress, ProgressSink, Subject, stamped
from optagent.protocols import Evaluator, GpuFacts, Planner, PlannerContext, PlannerExhausted, redact
from optagent.schema import EvalResult, Proposal, RunState, RunStatus, Step, StepOutcome, Usage, now
from optagent.search.store import RunStore
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
                 progress: Optional[ProgressSink] = None):
        self.store, self.task, self.planner, self.evaluator = store, task, planner, evaluator
        self.limits, self.on_step, self.progress = limits, on_step, progress
        self.config = store.config
        self.started = time.monotonic()

    def run(self) -> RunState:
        steps = self.store.steps()
        state = self.store.state() or RunState(status=RunStatus.RUNNING, steps=0)
        state = state.model_copy(update={"status": RunStatus.RUNNING, "reason": None})
        failures, last_failure = 0, ""  # consecutive planner errors
        try:
            if not steps:
                self._record(self._evaluate(0, Proposal(source=self.store.starter, idea="the starter kernel")), state)
            while True:
                self._check_limits(state)
                pending = self.store.unfinished()
                if pending:  # killed mid-evaluation: evaluate the same proposal again
                    index, proposal = pending
                else:
                    index = len(self.store.steps())
                    if self.progress:
                        self.progress(Progress(phase=Phase.PROPOSING, step=index))
                    try:
                        proposal = self.planner.propose(self._context(index))
                        failures = 0
                    except PlannerExhausted as e:
                        raise Exhausted(str(e) or "the planner has nothing more to try") from None
                    except Exception as e:  # an endpoint that fails is a recorded step, not a crash
                        failures, last_failure = failures + 1, f"{type(e).__name__}: {e}"
                        proposal = Proposal(idea="(planner failed)", error=f"planner failed: {last_failure}")
                    self.store.save_proposal(index, proposal, self.config.language)
                self._record(self._evaluate(index, proposal), state)
                if failures >= self.limits.planner_failures:
                    raise PlannerFailed(f"the planner failed {failures} times in a row, last: "
                                        f"{_first_line(last_failure)}")
        except Stop as stop:
            status, reason = stop.status, str(stop)
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            reason = f"stopped by Ctrl-C; optagent resume {self.store.path.name} continues it"
        if status is not RunStatus.INTERRUPTED and self.store.best() is None:
            status, reason = RunStatus.FAILED, self._nothing_passed(reason)
        self.store.save_state(state.model_copy(update={"status": status, "reason": reason, "updated_at": now()}))
        return self.store.state() or state

    def _nothing_passed(self, stopped: str) -> str:
        """Why a run without a single passing kernel failed: the starter's verdict first."""
        steps = self.store.steps()
        starter = next((s for s in steps if s.index == 0), None)
        if starter is None:
            why = "the starter was not evaluated"
        elif starter.result is not None:
            why = f"the starter failed: {starter.result.status.value}: {_first_line(starter.result.reason)}"
        else:
            why = f"the starter failed: {_first_line(starter.error)}"
        tried = sum(1 for s in steps if s.index > 0)
        after = f"; nor did the {tried} candidate(s) after it" if tried else ""
        return f"no kernel passed: {why}{after} (stopped: {stopped})"

    def _check_limits(self, state: RunState) -> None:
        done = [s for s in self.store.steps() if s.index > 0]
        if len(done) >= self.limits.max_steps:
            raise MaxSteps(f"--max-steps {self.limits.max_steps}: {len(done)} candidate(s) after the starter")
        if self.limits.time_limit_s and time.monotonic() - self.started >= self.limits.time_limit_s:
            raise TimeLimit(f"--time-limit {self.limits.time_limit_s:g} s reached")
        if self.limits.budget_usd is not None and state.usage.cost_usd >= self.limits.budget_usd:
            raise Budget(f"--budget-usd {self.limits.budget_usd:g}: ${state.usage.cost_usd:.2f} spent")
        streak = 0
        for s in reversed(done):
            if s.outcome is StepOutcome.ACCEPTED:
                break
            streak += 1
        if streak >= self.limits.patience:
            raise Converged(f"no gain >= {self.limits.min_gain:.0%} in {streak} steps")

    def _context(self, index: int) -> PlannerContext:
        best = self.store.best()
        attempts = [redact(s, self.store.step_source(s.index)) for s in self.store.steps()]
        gpu = None
        last = next((s.result for s in reversed(self.store.steps()) if s.result and s.result.gpu), None)
        if last is not None and last.gpu:
            gpu = GpuFacts(**last.gpu)
        language = self.config.language
        return PlannerContext(
            task_name=self.task.name, title=self.task.title, statement=self.task.statement,
            contract=self.task.contracts.get(language, ""), language=language, starter_source=self.store.starter,
            best_source=best[0] if best else self.store.starter, best_result=best[1] if best else None,
            attempts=attempts, gpu=gpu, step_index=index)

    def _evaluate(self, index: int, proposal: Proposal) -> Step:
        started = now()
        base = dict(index=index, started_at=started, idea=proposal.idea, usage=proposal.usage)
        if proposal.source is None:
            return Step(**base, finished_at=now(), outcome=StepOutcome.NO_KERNEL, error=proposal.error)
        self.store.save_proposal(index, proposal, self.config.language)
        language = self.config.language
        result = self.evaluator.evaluate(proposal.source, language, progress=stamped(self.progress, step=index))
        sha = result.source_sha256
        best = self.store.best()
        if not result.status.ok:
            outcome, note = StepOutcome.FAILED, None
        elif best is None:
            outcome, note = (StepOutcome.BASELINE if index == 0 else StepOutcome.ACCEPTED), None
            self.store.save_best(proposal.source, result)
        else:
            outcome, note, result = self._compare(best, proposal.source, result, index)
        return Step(**base, finished_at=now(), outcome=outcome, candidate_sha256=sha, result=result,
                    retime_note=note, error=result.reason if not result.status.ok else None)

    def _compare(self, best: tuple[str, EvalResult], source: str, result: EvalResult, index: int):
        """Noise-aware acceptance: faster by more than the spread, re-timed back to back."""
        best_source, best_result = best
        t_best, t_new = best_result.geomean_time_us, result.geomean_time_us
        gain = t_best / t_new - 1 if t_best and t_new else None
        if gain is None or gain <= self.limits.min_gain:
            return StepOutcome.NOT_BETTER, None, result
        spread = max(noise(best_result), noise(result))
        if gain > max(CLEAR_GAIN, 3 * spread):
            self.store.save_best(source, result)
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
                self.store.save_best(source, again_new)
                return StepOutcome.ACCEPTED, note, again_new
            outcome, kept = StepOutcome.NOT_BETTER, again_new
        if fresh:
            # The incumbent stays; its record becomes this timing, side by side with the candidate's: a
            # record taken on a slow stretch of the host would let a later candidate that is no faster
            # clear CLEAR_GAIN against it unchecked (and shows a best slower than the candidates that lost).
            self.store.save_best(best_source, again_best)
        return outcome, note, kept

    def _record(self, step: Step, state: RunState) -> None:
        self.store.save_step(step)
        best = self.store.best()
        steps = self.store.steps()
        best_step = next((s.index for s in reversed(steps) if s.outcome in (StepOutcome.ACCEPTED, StepOutcome.BASELINE)), None)
        usage = sum((s.usage for s in steps), Usage())
        upd = dict(steps=len(steps), best_step=best_step, usage=usage, updated_at=now(),
                   best_geomean_speedup=best[1].geomean_speedup if best else None)
        state.__dict__.update(upd)  # the caller's state object follows the disk
        self.store.save_state(state)
        step = step.model_copy(update={"best_geomean_speedup": upd["best_geomean_speedup"]})
        self.store.save_step(step)
        self.on_step(step, state)
