"""propose a round -> evaluate it -> record each step -> accept, until something says stop.

Stop conditions are exceptions. The run is read once, when the loop starts (trajectory.py); from
then on the loop works from memory. A round of ``width`` candidates (their parents chosen by
parents.py) is proposed and each proposal saved before anything is evaluated; the Pool evaluates
them, and each step is committed as its result arrives: step.json, one rename, holding its result
and any change of the best. A candidate that may beat the incumbent is committed PENDING, and once
the round is in, the round's comparison (accept.py: at most one back-to-back re-time) rewrites those
steps with their final outcome, the winner last, carrying the new best. A killed run (or one cut
off at its --time-limit, waits.py) resumes with the steps without step.json, then any PENDING ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from optagent import waits
from optagent.text import first_line
from optagent.progress import Phase, Progress, ProgressSink, Subject
from optagent.protocols import Memory, Planner, PlannerExhausted, PlannerWaiting, Pool, PoolJob
from optagent.schema import BestRef, EvalResult, PlannerKind, Proposal, RunState, RunStatus, Step, StepOutcome, now
from optagent.runs import view
from optagent.search import accept, rounds
from optagent.runs.store import RunStore
from optagent.runs.trajectory import Best, Trajectory
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
    width: int = 1  # candidates per round
    # when the time limit's clock started (time.monotonic()): the command's start, so that what came before the
    # loop (choosing the language by evaluating the starters, building the pool) counts too; None: the loop's own
    started: Optional[float] = None


class Loop:
    def __init__(self, store: RunStore, task: TaskPackage, planner: Planner, pool: Pool, limits: Limits,
                 on_step: Callable[[Step, RunState], None] = lambda s, st: None,
                 progress: Optional[ProgressSink] = None, memory: Optional[Memory] = None):
        self.store, self.task, self.planner, self.pool = store, task, planner, pool
        self.limits, self.on_step, self.progress, self.memory = limits, on_step, progress, memory
        self.config = store.config
        self.started = limits.started if limits.started is not None else time.monotonic()
        self.trajectory: Optional[Trajectory] = None  # read in run()
        self.loaded: set[int] = set()  # the steps recorded before this run: what it added is the rest
        self.state = RunState(status=RunStatus.RUNNING, steps=0)
        self._best_changed = False  # by the step being committed: written with its record
        self._failures, self._last_failure = 0, ""  # consecutive planner errors

    def run(self) -> RunState:
        self.store.remove_leftovers()
        traj = self.trajectory = Trajectory.load(self.store)
        self.loaded = {s.index for s in traj.steps}
        if traj.cache_stale:  # killed between a commit and the best/ cache it changed
            self.store.save_best(traj.best.source, traj.best.result)
        state = self.store.state() or self.state
        # the totals follow the steps: a kill between a step's record and the state's leaves the state behind
        self.state = state.model_copy(update={"status": RunStatus.RUNNING, "reason": None, **self._totals()})
        for index, proposal in traj.unfinished:
            if proposal.source is not None and self.store.step_source(index) is None:  # removed by hand
                self.store.save_candidate(index, proposal.source, self.config.language)
        cut, limit = False, self.limits.time_limit_s  # cut: in flight at the deadline, unfinished, not failed
        waits.set_deadline(self.started + limit if limit else None)
        try:
            if not traj.steps:  # the starter is proposed afresh
                traj.unfinished = [p for p in traj.unfinished if p[0] != 0]
                self._evaluate_round([(0, self._save(0, Proposal(source=traj.starter, idea="the starter kernel",
                                                                 round=0)))])
            while True:
                self._evaluate_round(traj.unfinished)  # a killed round's rest first, then each new round
                traj.unfinished = []
                self._accept_round()
                self._check_limits()
                traj.unfinished = self._propose_round()
        except Stop as stop:
            status, reason = stop.status, str(stop)
        except (waits.DeadlineReached, KeyboardInterrupt) as e:  # cut off in flight: those steps stay unfinished
            cut = isinstance(e, waits.DeadlineReached)
            status = RunStatus.TIME_LIMIT if cut else RunStatus.INTERRUPTED
            reason = (f"--time-limit {limit:g} s reached with work in flight (stopped)" if cut else "stopped by Ctrl-C") \
                + f"; optagent resume {self.store.path.name} continues it"
        finally:
            waits.set_deadline(None)
        if status is not RunStatus.INTERRUPTED and traj.best is None and not cut:
            status, reason = RunStatus.FAILED, self._nothing_passed(reason)
        self.state = self.state.model_copy(update={"status": status, "reason": reason, **self._totals(),
                                                   "updated_at": now()})
        self.store.save_state(self.state)
        return self.state

    def _save(self, index: int, proposal: Proposal) -> Proposal:
        self.store.save_proposal(index, proposal, self.config.language)
        return proposal

    def _propose_round(self) -> list[tuple[int, Proposal]]:
        """The next round's proposals, each saved before any is evaluated; cut to what --max-steps leaves."""
        traj = self.trajectory
        width = min(self.limits.width, self.limits.max_steps - traj.candidates,
                    rounds.affordable(self.limits.budget_usd, self.state.usage.cost_usd, traj.candidates))
        start, round_no = traj.next_index, traj.next_round
        if self.progress and getattr(self.planner, "name", None) is not PlannerKind.EXTERNAL:  # it proposes by hand, later
            self.progress(Progress(phase=Phase.PROPOSING, step=start))
        ctxs = view.contexts(self.task, self.config, traj, start, rounds.round_parents(traj, self.config, width),
                               self._recall())
        batch: list[tuple[int, Proposal]] = []
        exhausted, waiting = "the planner has nothing more to try", None
        for ctx, got in zip(ctxs, rounds.propose_all(self.planner, ctxs)):
            if isinstance(got, PlannerWaiting):  # an outside agent's round is all in: the run pauses
                waiting = str(got)
                continue
            if isinstance(got, PlannerExhausted):
                exhausted = str(got) or exhausted
                continue
            if isinstance(got, Exception):  # an endpoint that fails is a recorded step, not a crash
                self._failures, self._last_failure = self._failures + 1, f"{type(got).__name__}: {got}"
                got = Proposal(idea="(planner failed)", error=f"planner failed: {self._last_failure}")
            else:
                self._failures = 0
            index = start + len(batch)
            parent = got.parent if got.parent is not None else ctx.parent_step  # an outside agent may name it
            batch.append((index, self._save(index, got.model_copy(update={"parent": parent, "round": round_no}))))
        if not batch:
            raise Waiting(waiting) if waiting else Exhausted(exhausted)
        return batch

    def _evaluate_round(self, batch: Sequence[tuple[int, Proposal]]) -> None:
        """Each step committed as its result arrives: a kill loses none that finished."""
        if not batch:
            return
        proposals = dict(batch)
        started = now()  # the pool says when a result arrives, not when its evaluation began
        jobs = []
        for index, proposal in batch:
            if proposal.source is None:
                self._commit(Step(**self._base(index, proposal, started), finished_at=now(),
                                  outcome=StepOutcome.NO_KERNEL, error=proposal.error), None)
            else:
                jobs.append(PoolJob(index, proposal.source, self.config.language))
        for job, result in self.pool.evaluate(jobs, progress=self.progress):
            self._commit(self._arrived(job.key, proposals[job.key], result, started), job.source)

    @staticmethod
    def _base(index: int, proposal: Proposal, started) -> dict:
        return dict(index=index, started_at=started, idea=proposal.idea, usage=proposal.usage,
                    parent=proposal.parent, round=proposal.round)

    def _arrived(self, index: int, proposal: Proposal, result: EvalResult, started) -> Step:
        best = self.trajectory.best
        if not result.status.ok:
            outcome = StepOutcome.FAILED
        elif best is None:
            outcome = StepOutcome.BASELINE if index == 0 else StepOutcome.ACCEPTED
            self._set_best(proposal.source, result, index)
        else:
            outcome = accept.first_look(best.result, result, self.limits.min_gain)
        return Step(**self._base(index, proposal, started), finished_at=now(), outcome=outcome,
                    candidate_sha256=result.source_sha256, result=result,
                    error=result.reason if not result.status.ok else None)

    def _accept_round(self) -> None:
        """The round's PENDING steps decided together (accept.py), each rewritten; the winner's commit last."""
        traj = self.trajectory
        pending = traj.pending
        if not pending:
            return
        best = traj.best
        decision = accept.decide((best.step, best.source, best.result),
                                 [(s.index, traj.sources[s.index], s.result) for s in pending],
                                 self.limits.min_gain, self._retime)
        order = sorted(pending, key=lambda s: s.index == decision.winner)
        for k, s in enumerate(order):
            v = decision.verdicts[s.index]
            if s.index == decision.winner:
                self._set_best(traj.sources[s.index], v.result, s.index)
            elif decision.incumbent is not None and k == len(order) - 1:
                self._set_best(best.source, decision.incumbent, best.step)
            self._commit(s.model_copy(update={"outcome": v.outcome, "retime_note": v.note, "result": v.result,
                                              "finished_at": now(), "error": v.result.reason
                                              if not v.result.status.ok else None}), traj.sources[s.index])

    def _retime(self, pairs: Sequence[tuple[int, str]]) -> list[EvalResult]:
        """One back-to-back re-time on one lane: the incumbent first, then the round's candidates."""
        incumbent = pairs[0][0]
        sink = self.progress

        def relay(event: Progress) -> None:
            retimed = Subject.INCUMBENT_RETIME if event.step == incumbent else Subject.CANDIDATE_RETIME
            sink(event.model_copy(update={"subject": retimed}))
        jobs = [PoolJob(key, source, self.config.language) for key, source in pairs]
        return self.pool.retime(jobs, progress=relay if sink else None)

    def _nothing_passed(self, stopped: str) -> str:
        """Why a run without a single passing kernel failed: the starter's verdict first."""
        steps = self.trajectory.steps
        starter = next((s for s in steps if s.index == 0), None)
        if starter is None:
            why = "the starter was not evaluated"
        elif starter.result is not None:
            why = f"the starter failed: {starter.result.status.value}: {first_line(starter.result.reason, 300) or '(no reason given)'}"
        else:
            why = f"the starter failed: {first_line(starter.error, 300) or '(no reason given)'}"
        after = f"; nor did the {n} candidate(s) after it" if (n := self.trajectory.candidates) else ""
        return f"no kernel passed: {why}{after} (stopped: {stopped})"

    def _check_limits(self) -> None:
        done, state = self.trajectory.candidates, self.state
        if self._failures >= self.limits.planner_failures:
            raise PlannerFailed(f"the planner failed {self._failures} times in a row, last: "
                                f"{first_line(self._last_failure, 300) or '(no reason given)'}")
        if done >= self.limits.max_steps:
            raise MaxSteps(f"--max-steps {self.limits.max_steps}: {done} candidate(s) after the starter")
        if self.limits.time_limit_s and time.monotonic() - self.started >= self.limits.time_limit_s:
            raise TimeLimit(f"--time-limit {self.limits.time_limit_s:g} s reached")
        if self.limits.budget_usd is not None and state.usage.cost_usd >= self.limits.budget_usd:
            raise Budget(f"--budget-usd {self.limits.budget_usd:g}: ${state.usage.cost_usd:.2f} spent")
        streak = self.trajectory.streak
        if streak >= self.limits.patience:
            raise Converged(f"no gain >= {self.limits.min_gain:.0%} in {streak} steps")

    def _recall(self):
        return self.memory.recall() if self.memory else None

    def _set_best(self, source: str, result: EvalResult, step: Optional[int]) -> None:
        """In memory only: the change is written with the step's commit, in _commit."""
        self.trajectory.best = Best(source, result, step)
        self._best_changed = True

    def _totals(self) -> dict:
        t = self.trajectory
        return dict(steps=len(t.steps), best_step=t.best_step, usage=t.usage, best_geomean_speedup=t.best_speedup)

    def _commit(self, step: Step, source: Optional[str]) -> None:
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
        self.state = self.state.model_copy(update={**self._totals(), "updated_at": now()})
        self.store.save_state(self.state)
        if step.outcome is not StepOutcome.PENDING:  # a PENDING step is shown once decided
            self.on_step(step, self.state)
