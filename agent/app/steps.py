"""Runs an outside agent drives: start one, hand in a round, read what a planner would be told.

These are ordinary runs (planner ``external``): the same store, loop, accept rule and crash
safety as `optagent run`; `resume`, `show`, `report` and `leaderboard` apply, and `resume
--planner offline|llm` hands a run over to a built-in planner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel

from optagent.app.operations import OutsideError, Scope, device_of, language_of, render
from optagent.progress import ProgressSink
from optagent.app.runs import RunRequest, create_run, drive, next_prompt
from optagent.schema import Language, PlannerKind, Proposal, RunState, RunStatus, Status, Step, StepOutcome
from optagent.settings import UserError
from optagent.runs.store import RunStore
from optagent.runs.files import RunError
from optagent.task import TaskPackage

RunOpError = OutsideError  # one error type for every outside operation
MAX_ROUND = 16  # sources in one round: more is a batch job, not a round


class StepView(BaseModel):
    index: int
    idea: str
    outcome: StepOutcome
    status: Optional[Status] = None
    geomean_speedup: Optional[float] = None
    geomean_time_us: Optional[float] = None
    reason: Optional[str] = None
    parent: Optional[int] = None
    retime_note: Optional[str] = None


class Feedback(BaseModel):
    run_id: str
    status: RunStatus
    reason: Optional[str] = None
    best_step: Optional[int] = None
    best_geomean_speedup: Optional[float] = None
    best_changed: bool
    steps: list[StepView]  # the steps this call evaluated
    next_prompt: str  # what the LLM planner would be sent next: failures in detail, the best kernel, its table
    read: list[str] = []  # how each handed-in source was read (propose only)
    timed: bool = True  # whether the run's times rank kernels (False on the CPU: correctness only)
    passing: list[int] = []  # every step whose kernel passed


class RunStatusView(BaseModel):
    run_id: str
    task: str
    language: str
    device: str
    status: Optional[RunStatus] = None
    reason: Optional[str] = None
    steps: list[StepView]
    best_step: Optional[int] = None
    best_source: Optional[str] = None
    best_table: Optional[str] = None
    lineage: list[StepView]


class Board(BaseModel):
    rows: list[dict]
    text: str


class Export(BaseModel):
    run_id: str
    file: str
    source: str
    result: dict  # the EvalResult as JSON (see operations.Verdict)


def view(step: Step) -> StepView:
    r = step.result
    return StepView(index=step.index, idea=step.idea, outcome=step.outcome, status=r.status if r else None,
                    geomean_speedup=r.geomean_speedup if r else None, geomean_time_us=r.geomean_time_us if r else None,
                    reason=(r.reason if r else step.error), parent=step.parent,
                    retime_note=step.retime_note)


def lineage(steps: list[Step], best: Optional[int]) -> list[Step]:
    """The steps from the starter to the best kernel, following each step's parent."""
    by_index = {s.index: s for s in steps}
    chain: list[Step] = []
    at = best
    while at is not None and at in by_index and len(chain) <= len(steps):
        chain.append(by_index[at])
        at = by_index[at].parent
    return chain[::-1]


def open_run(scope: Scope, run_id: str) -> tuple[RunStore, TaskPackage]:
    try:
        store = RunStore.open(scope.runs_dir, run_id)
        cfg = store.config
    except RunError as e:
        raise OutsideError(str(e)) from None
    if Path(run_id).name != run_id:
        raise OutsideError(f"run {run_id!r}: give the run's id, not a path")
    try:
        task = scope.task(cfg.task_name)
    except OutsideError:
        raise OutsideError(f"run {run_id}: its task {cfg.task_name!r} is not one this server offers") from None
    if task.digest() != cfg.task_digest:
        raise OutsideError(f"{task.root}: the task package changed since run {run_id} started")
    return store, task


def _round(store: RunStore, task: TaskPackage, proposals: list[Proposal], progress: Optional[ProgressSink]) -> Feedback:
    """The agent's round (none: the starter only) through the run's loop, and what a planner is told next."""
    from optagent.app.build import build_pool, run_evaluator
    from optagent.search.planners.external import ExternalPlanner

    cfg = store.config
    try:  # a run recorded with --cluster ray stays on Ray
        pool = build_pool(run_evaluator(cfg, task), config=cfg)
    except UserError as e:  # Ray missing, or the cluster unreachable: the agent is told, in one line
        raise OutsideError(f"run {cfg.run_id}: {e}") from None
    try:
        driven = drive(store, task, ExternalPlanner(proposals), pool, progress=progress,
                       width=max(1, len(proposals)))  # the agent's sources are one round
    except RunError as e:
        raise OutsideError(str(e)) from None
    return _feedback(store, task, driven.state, driven.new_steps)


def _feedback(store: RunStore, task: TaskPackage, state: RunState, new: list[Step]) -> Feedback:
    from optagent.ranking import timings_rank

    results = [s.result for s in store.steps() if s.result is not None]
    return Feedback(run_id=store.config.run_id, status=state.status, reason=state.reason, best_step=state.best_step,
                    best_geomean_speedup=state.best_geomean_speedup,
                    best_changed=any(s.outcome.keeps_best for s in new),
                    steps=[view(s) for s in new], next_prompt=next_prompt(store, task),
                    timed=timings_rank(store.config.device, results),
                    passing=[s.index for s in store.steps() if s.result is not None and s.result.status.ok])


def start_run(scope: Scope, task_name: str, language: Optional[str], max_steps: int,
              progress: Optional[ProgressSink] = None) -> Feedback:
    task = scope.task(task_name)
    config = RunRequest(device=device_of(scope), planner=PlannerKind.EXTERNAL, language=language_of(task, language),
                        max_steps=max_steps).config(task)
    return _round(create_run(scope.runs_dir, task, config), task, [], progress)


def _hand_ins(scope: Scope, run_id: str, sources: list[str], ideas: Optional[list[str]],
              parents: Optional[list[Optional[int]]], labels: Optional[list[str]]):
    """The run and its round's hand-ins, each read against its parent (app/handin.py)."""
    from optagent.app.handin import HandInError, read_round

    if not sources:
        raise OutsideError("propose: give at least one kernel source")
    if len(sources) > MAX_ROUND:
        raise OutsideError(f"propose: {len(sources)} sources in one round; at most {MAX_ROUND}")
    if ideas is not None and len(ideas) != len(sources):
        raise OutsideError(f"propose: {len(ideas)} ideas for {len(sources)} sources; give one idea per source")
    if parents is not None and len(parents) != len(sources):
        raise OutsideError(f"propose: {len(parents)} parents for {len(sources)} sources; give one per source")
    store, task = open_run(scope, run_id)
    if store.config.planner is not PlannerKind.EXTERNAL:
        raise OutsideError(f"run {run_id} is driven by the {store.config.planner.value} planner, not by an "
                           "outside agent (optagent resume RUN --planner external hands it over)")
    try:
        read = read_round(store, sources, ideas, parents or [None] * len(sources),
                          labels or [f"source {i + 1}" for i in range(len(sources))])
    except HandInError as e:
        raise OutsideError(str(e)) from None
    return store, task, read


def propose(scope: Scope, run_id: str, sources: list[str], ideas: Optional[list[str]] = None,
            parent: Optional[int] = None, progress: Optional[ProgressSink] = None, *,
            parents: Optional[list[Optional[int]]] = None, labels: Optional[list[str]] = None) -> Feedback:
    """One round: each source read as the prompt asks for it (IDEA + SEARCH/REPLACE against its parent,
    a fenced whole file, or raw source), recorded with its parent (given, or the one the feedback names)."""
    if parent is not None:
        parents = [p if p is not None else parent for p in (parents or [None] * len(sources))]
    store, task, read = _hand_ins(scope, run_id, sources, ideas, parents, labels)
    proposals = [Proposal(source=h.source, idea=h.idea or f"outside agent's kernel {i + 1}", parent=h.parent,
                          meta={"read_as": h.read_as.value, "edit_blocks": h.blocks})
                 for i, h in enumerate(read)]
    return _round(store, task, proposals, progress).model_copy(update={"read": [h.describe() for h in read]})


def check(scope: Scope, run_id: str, sources: list[str], parents: Optional[list[Optional[int]]] = None,
          labels: Optional[list[str]] = None) -> list[str]:
    """What propose would evaluate, read and scanned, one entry per source (a source that cannot be read
    says why, beside the others); nothing is run or recorded."""
    from optagent.integrity import python_syntax_error, static_verdict

    labels = labels or [f"source {i + 1}" for i in range(len(sources))]
    parents = parents or [None] * len(sources)
    out = []
    for i, text in enumerate(sources):
        try:
            store, _, (h,) = _hand_ins(scope, run_id, [text], None, [parents[i]], [labels[i]])
        except OutsideError as e:
            out.append(f"{labels[i]}: NOT READ\n  {e}")
            continue
        lang = store.config.language
        bad = python_syntax_error(h.source) if lang is not Language.CUDA else None
        why = bad or static_verdict(h.source, lang)
        verdict = (f"COMPILE_ERROR: {bad}" if bad else f"REJECTED before running: {why}" if why else
                   "syntax and scan OK (kernels compile when first launched: only an evaluation runs that)")
        out.append(f"{h.describe()}\n  {verdict}")
    return out


def feedback(scope: Scope, run_id: str) -> Feedback:
    """What a planner would be shown next, without evaluating anything."""
    store, task = open_run(scope, run_id)
    state = store.state()
    if state is None:
        raise OutsideError(f"{store.path}: the run has no state yet (its starter was never evaluated)")
    return _feedback(store, task, state, [])


def run_status(scope: Scope, run_id: str) -> RunStatusView:
    from optagent.report.format import print_eval

    store, _ = open_run(scope, run_id)
    cfg, state, steps, best = store.config, store.state(), store.steps(), store.best()
    return RunStatusView(
        run_id=cfg.run_id, task=cfg.task_name, language=cfg.language.value, device=cfg.device.value,
        status=state.status if state else None, reason=state.reason if state else None,
        steps=[view(s) for s in steps], best_step=state.best_step if state else None,
        best_source=best[0] if best else None,
        best_table=render(lambda con: print_eval(con, best[1])) if best else None,
        lineage=[view(s) for s in lineage(steps, state.best_step if state else None)])


def leaderboard(scope: Scope, task: Optional[str] = None) -> Board:
    from optagent.report.leaderboard import as_json, gather, print_board

    entries = gather(scope.runs_dir, task)
    return Board(rows=as_json(entries), text=render(lambda con: print_board(con, entries)))


def export(scope: Scope, run_id: str) -> Export:
    from optagent.report.leaderboard import export as write_export
    from optagent.report.leaderboard import gather

    store, _ = open_run(scope, run_id)
    entries = [e for e in gather(scope.runs_dir, store.config.task_name) if e.config.run_id == store.config.run_id]
    if not entries:
        raise OutsideError(f"run {run_id}: no passing kernel to export")
    (kernel,) = write_export(entries, scope.runs_dir / "export" / run_id)
    return Export(run_id=run_id, file=str(kernel), source=entries[0].source,
                  result=entries[0].result.model_dump(mode="json"))


