"""The LLM planner: prompt from the PlannerContext, reply parsed into a kernel.

Each step is one stateless request (system + user message) so that a prompt
never grows with the run; the only state carried between steps is the
feedback of a reply that could not be applied, shown in the next prompt.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

from optagent.ranking import timings_rank
from optagent import waits
from optagent.integrity import ALLOWED_IMPORTS
from optagent.llm import budget
from optagent.llm.result_view import num, result_view, trim
from optagent.llm import feedback as fb
from optagent.llm.feedback import Rules
from optagent.llm.edits import EditError, kernel_from_reply
from optagent.llm.replies import NoKernelError, extract_idea
from optagent.llm.prompts import render
from optagent.search.planners.memory_view import memory_view
from optagent.protocols import LLM
from optagent.runs.view import Attempt, PlannerContext
from optagent.schema import CaseKind, Language, PlannerKind, Proposal, StepOutcome, Usage

RECENT_ATTEMPTS = 5  # attempts shown in detail; older ones only in the ledger
LEDGER_MAX = 60
NO_IDEA = "(the reply states no idea)"

# ---------------------------------------------------------------- the context, ready to render


def _effect(a: Attempt) -> str:
    """What an attempt came to, beside its outcome: '' where the outcome says it all (PASSED on the CPU,
    where an interpreter's speedup would read as a result)."""
    if a.result is None:
        return "no kernel" if a.outcome == StepOutcome.NO_KERNEL.value else (a.error or "-").split("\n")[0][:80]
    if a.result.status.ok:
        return "" if not timings_rank(results=[a.result]) else f"{num(a.result.geomean_speedup, '.3f')}x geomean"
    why = (a.result.reason or "").split("\n")[0]  # a short why: only the last few attempts keep their details
    return a.result.status.value + (f" ({why[:70]}{'...' if len(why) > 70 else ''})" if why else "")


def _attempt_view(a: Attempt, attempts: list[Attempt], starter: str, same_as: Optional[int] = None
                  ) -> dict[str, Any]:
    # A failed edit's full message (with nearest lines) goes in the feedback section; one line here.
    error = (a.error or "").split("\n")[0] if a.outcome == StepOutcome.NO_KERNEL.value else trim(a.error)
    failed = budget.failed(a) and same_as is None
    shown = budget.change(budget.parent_source(a, attempts, starter), a.source) if failed else budget.change(None, None)
    if same_as or (a.result is not None and fb.failing_groups(a.result)):  # the groups below say it, per case
        error = ""
    return {"index": a.index, "idea": a.idea, "outcome": a.outcome, "error": error,
            "parent": "-" if a.parent is None else a.parent, "effect": _effect(a), "result": result_view(a.result, a.source, a.hidden_failed),
            "same_as": same_as, "summary": budget.summary_line(a) if same_as else None,
            "diff": shown["diff"], "rewritten": shown["rewritten"], "retime_note": a.retime_note or ""}


def _ledger_row(a: Attempt) -> dict[str, Any]:
    return {"index": a.index, "idea": a.idea, "outcome": a.outcome, "effect": _effect(a),
            "parent": "-" if a.parent is None else a.parent}


def _tree_view(ctx: PlannerContext) -> dict[str, Any]:
    """The slot's place in the tree: its parent, the ideas along its lineage, its siblings, its direction."""
    incumbent = ctx.incumbent_result
    return {
        "parent": ctx.parent_step,
        "on_incumbent": ctx.parent_step is None or ctx.parent_step == ctx.incumbent_step,
        "incumbent_step": ctx.incumbent_step,
        "incumbent_geomean": num(incumbent.geomean_speedup if incumbent else None, ".3f"),
        "lineage": [{"index": a.index, "idea": a.idea, "effect": _effect(a)} for a in ctx.lineage
                    if a.outcome != StepOutcome.BASELINE.value],
        "siblings": [{"index": a.index, "idea": a.idea, "outcome": a.outcome, "effect": _effect(a)}
                     for a in ctx.siblings[-LEDGER_MAX:]],
        "slot": ctx.slot,
        "width": ctx.width,
        "other_parents": sorted({p for k, p in enumerate(ctx.round_parents) if k != ctx.slot}),
    }


def on_cpu(ctx: PlannerContext) -> bool:
    return ctx.on_cpu or not timings_rank(results=[ctx.best_result])


def prompt_vars(ctx: PlannerContext, feedback: str = "", whole_file: bool = False,
                edit_failures: int = 0, rules: Optional[Rules] = None,
                hand_in: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The templates' variables; ``hand_in`` ({"run_id": ...}) for an outside agent in step mode, who
    hands replies in as files rather than answering a request."""
    tried = [a for a in ctx.attempts if a.outcome != StepOutcome.BASELINE.value]
    recent = [_attempt_view(a, ctx.attempts, ctx.starter_source, same)
              for a, same in budget.detailed(tried, ctx.attempts, RECENT_ATTEMPTS)]
    rules = rules or Rules()
    return {
        "task_name": ctx.task_name,
        "title": ctx.title,
        "statement": ctx.statement.strip(),
        "contract": ctx.contract.strip(),
        "language": ctx.language.value,
        "fence": ctx.language.fence,
        "best_source": (budget.fold_docstring(ctx.best_source) if ctx.language is not Language.CUDA
                        else ctx.best_source).rstrip("\n"),
        "best_is_starter": ctx.best_source.strip() == ctx.starter_source.strip(),
        "best": result_view(ctx.best_result),
        "gpu": ctx.gpu,
        "step_index": ctx.step_index,
        "ledger": [_ledger_row(a) for a in tried[-LEDGER_MAX:]],
        "ledger_cut": max(0, len(tried) - LEDGER_MAX),
        "ledger_summary": fb.ledger_summary(tried[:-LEDGER_MAX] if len(tried) > LEDGER_MAX else []),
        "recent": recent,
        # every attempt is in the details below (with its parent): the table would say it twice
        "ledger_in_detail": len(tried) <= LEDGER_MAX and {a.index for a in tried} <= {r["index"] for r in recent},
        "rules": rules.view(),
        "device": fb.run_device(rules, ctx.attempts),
        "retime_notes": fb.retime_notes(ctx.attempts),
        "feedback": feedback.strip("\n"),
        "whole_file": whole_file,
        "edit_failures": edit_failures,
        "memory": memory_view(ctx.memory),
        "tree": _tree_view(ctx),
        "on_cpu": on_cpu(ctx),
        # only where the run has them: a package without a manifest has none, and the prompt must not promise them
        "hidden_cases": any(c.kind is CaseKind.HIDDEN for c in (ctx.best_result.cases if ctx.best_result else [])),
        "hand_in": hand_in,
        # the static scan's rule, told before a rejection costs a step (a model met it only after one)
        "allowed_imports": sorted(ALLOWED_IMPORTS - {"__future__"}) if ctx.language is not Language.CUDA else [],
        "scan": fb.scan_rules(ctx.language),
    }


def build_messages(ctx: PlannerContext, feedback: str = "", whole_file: bool = False,
                   edit_failures: int = 0, rules: Optional[Rules] = None,
                   hand_in: Optional[dict[str, Any]] = None) -> list[dict]:
    variables = prompt_vars(ctx, feedback, whole_file, edit_failures, rules, hand_in)
    return [
        {"role": "system", "content": render("system", **variables)},
        {"role": "user", "content": render("propose", **variables)},
    ]


# ---------------------------------------------------------------- replies -> proposals (shared)


def proposal_from_reply(
    text: str,
    ctx: PlannerContext,
    usage: Optional[Usage] = None,
    request: Optional[list[dict]] = None,
    idea: Optional[str] = None,
) -> tuple[Proposal, Optional[Exception]]:
    """The Proposal a reply makes against ctx.best_source, and the parse failure if any.

    Never raises for a bad reply: the loop records the error as a NO_KERNEL step.
    """
    idea = idea or extract_idea(text) or NO_IDEA
    common: dict[str, Any] = {"idea": idea, "request": request, "reply": text, "usage": usage or Usage()}
    try:
        source, parsed = kernel_from_reply(text, ctx.best_source, ctx.language)
    except EditError as exc:
        return Proposal(error=str(exc), meta={"reply_kind": "edit_error", "block": exc.block}, **common), exc
    except NoKernelError as exc:
        return Proposal(error=str(exc), meta={"reply_kind": "no_kernel"}, **common), exc
    meta = {"reply_kind": parsed.kind, "edit_blocks": len(parsed.edits)}
    return Proposal(source=source, meta=meta, **common), None


# ---------------------------------------------------------------- the planner


class LLMPlanner:
    name = PlannerKind.LLM

    def __init__(self, llm: LLM, max_edit_failures: int = 2, rules: Optional[Rules] = None,
                 max_repairs: int = 2) -> None:
        self.llm = llm
        self.rules = rules
        self.model: Optional[str] = llm.model
        self.max_edit_failures = max_edit_failures
        self.max_repairs = max_repairs  # requests within a step that repair edits which did not apply
        self._edit_failures = 0  # consecutive steps whose SEARCH/REPLACE edits did not apply
        self._feedback = ""  # rendered edit_failed.j2 for the next prompt

    def propose(self, ctx: PlannerContext) -> Proposal:
        proposal, failure = self._ask(ctx)
        self._remember(failure)
        return proposal

    def propose_round(self, ctxs: list[PlannerContext]) -> list[Union[Proposal, Exception]]:
        """The round's requests sent at once, one thread each (each retried by retry.py's policy);
        a request that still fails is its slot's outcome."""
        with ThreadPoolExecutor(max_workers=max(1, len(ctxs))) as pool:
            futures = [pool.submit(self._ask, ctx) for ctx in ctxs]
            waits.all_done(futures)  # in slices, not in the pool's shutdown: Ctrl-C is heard at once
        out: list[Union[Proposal, Exception]] = []
        for future in futures:
            error = future.exception()
            if error is not None:
                out.append(error)
                continue
            proposal, failure = future.result()
            self._remember(failure)  # in slot order: the next round hears of the last failed reply
            out.append(proposal)
        return out

    def _ask(self, ctx: PlannerContext) -> tuple[Proposal, Optional[Exception]]:
        whole_file = self._edit_failures >= self.max_edit_failures
        messages = build_messages(ctx, self._feedback, whole_file, self._edit_failures, self.rules)
        reply = self.llm.complete(messages)  # errors left after retry.py's policy go to the loop
        usage, reasoning = reply.usage, len(reply.reasoning)
        proposal, failure = proposal_from_reply(reply.text, ctx, usage, messages)
        idea = extract_idea(reply.text) or None
        repairs = 0
        # An edit that misses is repaired inside the step: the model sees the nearest lines at once,
        # and the step is spent on a kernel, not on a copying mistake.
        while isinstance(failure, EditError) and repairs < self.max_repairs:
            repairs += 1
            messages = messages + [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": render("edit_repair", error=str(failure), attempt=repairs,
                                                   attempts=self.max_repairs, fence=ctx.language.fence)}]
            try:
                reply = self.llm.complete(messages)
            except Exception as exc:  # the step keeps the reply it has; the next step starts afresh
                proposal.meta["repair_error"] = f"{type(exc).__name__}: {exc}"[:300]
                break
            usage, reasoning = usage + reply.usage, reasoning + len(reply.reasoning)
            proposal, failure = proposal_from_reply(reply.text, ctx, usage, messages,
                                                    idea=extract_idea(reply.text) or idea)
        proposal.meta.update(whole_file_requested=whole_file, repairs=repairs, reasoning_chars=reasoning)
        return proposal, failure

    def _remember(self, failure: Optional[Exception]) -> None:
        if failure is None:
            self._edit_failures, self._feedback = 0, ""
            return
        kind = "edit" if isinstance(failure, EditError) else "no_kernel"
        if kind == "edit":
            self._edit_failures += 1
        self._feedback = render(
            "edit_failed",
            kind=kind,
            error=str(failure),
            failures=self._edit_failures,
            whole_file_next=self._edit_failures >= self.max_edit_failures,
        )
