"""What a planner may see of the run: each past step as an Attempt (hidden integrity cases reduced to a
verdict), and each slot's PlannerContext, built from the run held in memory (Trajectory) and its tree.

One module for the planner's view, whoever asks for it: the loop's rounds, step mode's next prompt, the
ledger's reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from optagent.ranking import timings_rank
from optagent.runs.tree import lineage, parents as tree_parents
from optagent.schema import CaseKind, EvalResult, GpuFacts, Language, RunConfig, Step
from optagent.task import TaskPackage

if TYPE_CHECKING:
    from optagent.runs.memory import Recall
    from optagent.runs.trajectory import Trajectory


@dataclass
class Attempt:
    """One past step, as a planner sees it (hidden cases already redacted)."""

    index: int
    idea: str
    outcome: str
    error: Optional[str]
    result: Optional[EvalResult]
    source: Optional[str] = None
    retime_note: Optional[str] = None  # how the comparison that decided its outcome went
    hidden_failed: int = 0  # hidden cases that failed: counted for the planner, never described
    parent: Optional[int] = None  # the step it was derived from (None: the starter, or an old run)
    round: Optional[int] = None  # the round it was proposed in (None: not known)


@dataclass
class PlannerContext:
    """Everything a planner may know when proposing the next kernel."""

    task_name: str
    title: str
    statement: str
    contract: str
    language: Language
    starter_source: str
    best_source: str
    best_result: Optional[EvalResult]
    attempts: list[Attempt] = field(default_factory=list)
    gpu: Optional[GpuFacts] = None
    step_index: int = 0
    memory: Optional[Recall] = None  # what earlier runs on the task found (None: none, or --fresh)
    # The tree (search/parents.py): best_source and best_result above are this slot's parent's.
    parent_step: Optional[int] = None  # None: the starter, not evaluated yet
    incumbent_step: Optional[int] = None  # the run's best kernel, and its result
    incumbent_result: Optional[EvalResult] = None
    lineage: list[Attempt] = field(default_factory=list)  # the steps from the starter down to the parent
    siblings: list[Attempt] = field(default_factory=list)  # the parent's other children so far, as they fared
    slot: int = 0  # this candidate's place among the round's width
    width: int = 1
    round_parents: list[int] = field(default_factory=list)  # each slot's parent, this one's included
    on_cpu: bool = False  # timed by Triton's interpreter: its times are not GPU times


def as_attempt(step: Step, source: Optional[str] = None) -> Attempt:
    """A step as the planner may see it: hidden integrity cases reduced to a verdict."""
    result, error, hidden_failed = step.result, step.error, 0
    if result is not None:
        hidden = [c for c in result.cases if c.kind is CaseKind.HIDDEN]
        shown = [c for c in result.cases if c.kind is not CaseKind.HIDDEN]
        failed_hidden = [c for c in hidden if not c.status.ok]
        told = f"a hidden integrity case failed: {failed_hidden[0].status.value}" if failed_hidden else None

        def names_hidden(text: Optional[str]) -> bool:
            return bool(text) and any(c.reason and c.reason in text for c in failed_hidden)
        reason = told if names_hidden(result.reason) else result.reason
        # the step's error is the result's reason where it failed: it would tell the hidden case too
        error = told if names_hidden(error) else error
        result = result.model_copy(update={"cases": shown, "reason": reason})
        hidden_failed = len(failed_hidden)
    return Attempt(step.index, step.idea, step.outcome.value, error, result, source, step.retime_note, hidden_failed,
                   step.parent, step.round)


def contexts(task: TaskPackage, config: RunConfig, traj: Trajectory, start: int,
             parents: list[Optional[int]], memory=None) -> list[PlannerContext]:
    """Each slot's context; memory is what the task's ledger recalls (the same for every slot)."""
    attempts: dict[int, Attempt] = {a.index: a for a in traj.attempts}
    incumbent = traj.best
    up = tree_parents(traj.steps)
    out = []
    for slot, parent in enumerate(parents):
        source, result, chain, siblings = traj.starter, None, [], []
        if incumbent is not None and parent == incumbent.step:
            source, result = incumbent.source, incumbent.result
        elif parent is not None:
            source, result = traj.sources.get(parent) or traj.starter, attempts[parent].result
        if parent is not None:
            chain = [attempts[s.index] for s in lineage(traj.steps, parent)]
            siblings = [a for a in traj.attempts if up.get(a.index) == parent]
        out.append(PlannerContext(
            task_name=task.name, title=task.title, statement=task.statement,
            contract=task.contracts.get(config.language, ""), language=config.language,
            starter_source=traj.starter, best_source=source, best_result=result,
            attempts=list(traj.attempts), gpu=traj.gpu_facts(), step_index=start + slot,
            parent_step=parent, incumbent_step=incumbent.step if incumbent else None,
            incumbent_result=incumbent.result if incumbent else None,
            lineage=chain, siblings=siblings,
            slot=slot, width=len(parents), round_parents=[p for p in parents if p is not None],
            on_cpu=not timings_rank(config.device), memory=memory))
    return out
