"""What the loop knows of its run: read from the store once, then kept in step with what the loop writes.

The planner's context, the stop conditions and the run's summary come from here, so a step costs
the same whether it is the 5th or the 1000th: nothing is re-read from disk after the run starts.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple, Optional

from optagent.runs.view import Attempt, as_attempt
from optagent.schema import GpuFacts
from optagent.schema import BestRef, EvalResult, Proposal, Step, StepOutcome, Usage
from optagent.runs.store import RunStore

# A candidate that counts as progress for --patience: accepted. On the CPU nothing is accepted on a timing
# (accept.py), so a CPU run stops --patience candidates after its first passing kernel: every strategy
# passing would otherwise run the whole library under the interpreter (the README's first command).
PROGRESS = (StepOutcome.ACCEPTED,)


class Best(NamedTuple):
    source: str
    result: EvalResult  # its latest timing: re-timed side by side with a candidate, it replaces the first
    step: Optional[int] = None  # the step whose candidate it is


class Trajectory:
    """The finished steps in index order, each one's source, the best kernel and the running totals."""

    def __init__(self, starter: str, best: Optional[Best] = None,
                 unfinished: Optional[list[tuple[int, Proposal]]] = None):
        self.starter = starter
        self.best = best
        self.unfinished = list(unfinished or [])  # proposals saved, never evaluated: evaluated first on resume
        self.cache_stale = False  # best/ disagrees with the latest commit (killed before the cache was written)
        self._reset()

    def _reset(self) -> None:
        self.steps: list[Step] = []
        self.sources: dict[int, Optional[str]] = {}
        self.attempts: list[Attempt] = []  # as the planner sees them, redacted once per step
        self.usage = Usage()
        self.best_step: Optional[int] = None
        self.best_ref: Optional[BestRef] = None  # the best named by the latest commit that changed it
        self.candidates = 0  # steps after the starter
        self.streak = 0  # candidates since the last accepted one
        self.gpu: Optional[GpuFacts] = None  # the latest measured device's facts
        self.children: dict[int, int] = {}  # step -> how many finished steps were derived from it
        self.last_round: Optional[int] = None

    @classmethod
    def load(cls, store: RunStore) -> "Trajectory":
        """The one read of a run's steps, sources and best; damage is a RunError naming the file."""
        cached = store.best()
        traj = cls(store.starter, None, store.unfinished_steps())
        for step in store.steps():
            traj.add(step, store.step_source(step.index))
        ref = traj.best_ref
        source = traj.sources.get(ref.step) if ref else None
        if ref is not None and source is not None:
            traj.best = Best(source, ref.result, ref.step)
            traj.cache_stale = cached != (source, ref.result)
        return traj

    def add(self, step: Step, source: Optional[str]) -> None:
        """A finished step, as just written to the store."""
        if self.steps and step.index <= self.steps[-1].index:
            # re-evaluated behind the last step (a gap made by hand): rare, so the totals are recounted
            kept = [(s, self.sources[s.index]) for s in self.steps if s.index != step.index]
            kept.insert(bisect.bisect([s.index for s, _ in kept], step.index), (step, source))
            self._reset()
            for s, src in kept:
                self._append(s, src)
        else:
            self._append(step, source)

    def _append(self, step: Step, source: Optional[str]) -> None:
        self.steps.append(step)
        self.sources[step.index] = source
        self.attempts.append(as_attempt(step, source))
        self.usage = self.usage + step.usage
        if step.parent is not None:
            self.children[step.parent] = self.children.get(step.parent, 0) + 1
        if step.round is not None:
            self.last_round = max(step.round, self.last_round or 0)
        if step.outcome.keeps_best:
            self.best_step = step.index
        if step.best is not None and (self.best_ref is None or step.best.seq > self.best_ref.seq):
            self.best_ref = step.best
        if step.index > 0:
            self.candidates += 1
            self.streak = 0 if step.outcome in PROGRESS else self.streak + 1
        if step.result is not None and step.result.gpu:
            self.gpu = step.result.gpu

    @property
    def next_seq(self) -> int:
        return self.best_ref.seq + 1 if self.best_ref else 0

    @property
    def next_index(self) -> int:
        return max([s.index for s in self.steps] + [i for i, _ in self.unfinished], default=-1) + 1

    @property
    def next_round(self) -> int:
        rounds = [r for r in [self.last_round] + [p.round for _, p in self.unfinished] if r is not None]
        return max(rounds) + 1 if rounds else int(bool(self.steps))

    @property
    def pending(self) -> list[Step]:
        """Committed steps whose round's comparison has not been made (accept.py)."""
        return [s for s in self.steps if s.outcome is StepOutcome.PENDING]

    @property
    def best_speedup(self) -> Optional[float]:
        return self.best.result.geomean_speedup if self.best else None

    def gpu_facts(self) -> Optional[GpuFacts]:
        return self.gpu
