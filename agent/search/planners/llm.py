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
from optagent.llm import feedback as fb
from optagent.llm.feedback import Rules
from optagent.llm.edits import EditError, kernel_from_reply
from optagent.llm.replies import NoKernelError, extract_idea
from optagent.llm.profile_view import profile_rows
from optagent.llm.prompts import render
from optagent.search.planners.memory_view import memory_view
from optagent.protocols import LLM
from optagent.runs.view import Attempt, PlannerContext
from optagent.schema import EvalResult, FloorKind, Language, PlannerKind, Proposal, StepOutcome, Usage

RECENT_ATTEMPTS = 5  # attempts shown in detail; older ones only in the ledger
LEDGER_MAX = 60
_ERROR_LINES, _ERROR_CHARS = 40, 3000
_LOG_LINES = 30
NO_IDEA = "(the reply states no idea)"

# ---------------------------------------------------------------- the context, ready to render


def trim(text: Optional[str], max_lines: int = _ERROR_LINES, max_chars: int = _ERROR_CHARS) -> str:
    """Head and tail of a long error: the first lines name the error, the last the failing frame."""
    if not text:
        return ""
    lines = text.strip("\n").split("\n")
    if len(lines) > max_lines:
        head, tail = max_lines // 3, max_lines - max_lines // 3
        lines = lines[:head] + [f"... ({len(lines) - head - tail} lines cut) ..."] + lines[-tail:]
    out = "\n".join(lines)
    if len(out) > max_chars:
        half = max_chars // 2
        out = out[:half] + f"\n... ({len(out) - 2 * half} characters cut) ...\n" + out[-half:]
    return out


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _case_rows(result: EvalResult) -> list[dict[str, str]]:
    return [
        {
            "case": c.case,
            "sizes": c.sizes or "-",
            "status": c.status.value,
            "time_us": _num(c.time_us, ".2f"),
            "baseline_us": _num(c.baseline_us, ".2f"),
            "speedup": _num(c.speedup, ".3f"),
            # an estimated floor (no bytes_moved hook) is marked as one, as in the CLI
            "floor_pct": (f"~{c.pct_of_floor:.0f} est." if c.floor_kind is FloorKind.ESTIMATE and c.pct_of_floor
                          else _num(c.pct_of_floor, ".1f")),
            "bound": c.bound or "-",
            "tolerance": _num(c.tolerance, ".1e"),
        }
        for c in result.cases
    ]


def _result_view(result: Optional[EvalResult], source: Optional[str] = None,
                 hidden_failed: int = 0) -> Optional[dict[str, Any]]:
    if result is None:
        return None
    log_tail = trim(result.log_tail, _LOG_LINES) if result.log_tail else ""
    reason = trim(result.reason)
    return {
        "status": result.status.value,
        "reason": reason,
        "log_tail": "" if log_tail and log_tail in reason else log_tail,
        "geomean": _num(result.geomean_speedup, ".3f"),
        "device_name": result.device_name or result.device,
        "baseline_label": result.baseline_label or "the package's baseline",
        "rows": _case_rows(result),
        "floor_estimated": any(c.floor_kind is FloorKind.ESTIMATE and c.pct_of_floor for c in result.cases),
        "groups": fb.failing_groups(result),
        "kernels": fb.kernel_lines(result),
        "profile": profile_rows(result),
        "error_at": fb.error_at(result, source),
        "hidden_failed": hidden_failed,
    }


def _effect(a: Attempt) -> str:
    if a.result is None:
        return "no kernel" if a.outcome == StepOutcome.NO_KERNEL.value else (a.error or "-").split("\n")[0][:80]
    if a.result.status.ok:  # an interpreter's speedup would read as a result: on the CPU none is shown
        return "passed" if not timings_rank(results=[a.result]) else f"{_num(a.result.geomean_speedup, '.3f')}x geomean"
    return a.result.status.value


def _attempt_view(a: Attempt, attempts: list[Attempt], starter: str) -> dict[str, Any]:
    # A failed edit's full message (with nearest lines) goes in the feedback section; one line here.
    error = (a.error or "").split("\n")[0] if a.outcome == StepOutcome.NO_KERNEL.value else trim(a.error)
    failed = a.result is not None and not a.result.status.ok
    parent = fb.parent_source(attempts, a.index, starter) if failed else None
    return {"index": a.index, "idea": a.idea, "outcome": a.outcome, "error": error,
            "effect": _effect(a), "result": _result_view(a.result, a.source, a.hidden_failed),
            "diff": fb.diff(parent, a.source) if failed else "", "retime_note": a.retime_note or ""}


def _ledger_row(a: Attempt) -> dict[str, Any]:
    return {"index": a.index, "idea": a.idea, "outcome": a.outcome, "effect": _effect(a)}


def _tree_view(ctx: PlannerContext) -> dict[str, Any]:
    """The slot's place in the tree: its parent, the ideas along its lineage, its siblings, its direction."""
    incumbent = ctx.incumbent_result
    return {
        "parent": ctx.parent_step,
        "on_incumbent": ctx.parent_step is None or ctx.parent_step == ctx.incumbent_step,
        "incumbent_step": ctx.incumbent_step,
        "incumbent_geomean": _num(incumbent.geomean_speedup if incumbent else None, ".3f"),
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
                edit_failures: int = 0, rules: Optional[Rules] = None) -> dict[str, Any]:
    tried = [a for a in ctx.attempts if a.outcome != StepOutcome.BASELINE.value]
    recent = [_attempt_view(a, ctx.attempts, ctx.starter_source) for a in tried[-RECENT_ATTEMPTS:]]
    rules = rules or Rules()
    return {
        "task_name": ctx.task_name,
        "title": ctx.title,
        "statement": ctx.statement.strip(),
        "contract": ctx.contract.strip(),
        "language": ctx.language.value,
        "fence": ctx.language.fence,
        "best_source": ctx.best_source.rstrip("\n"),
        "best_is_starter": ctx.best_source.strip() == ctx.starter_source.strip(),
        "best": _result_view(ctx.best_result),
        "gpu": ctx.gpu,
        "step_index": ctx.step_index,
        "ledger": [_ledger_row(a) for a in tried[-LEDGER_MAX:]],
        "ledger_cut": max(0, len(tried) - LEDGER_MAX),
        "ledger_summary": fb.ledger_summary(tried[:-LEDGER_MAX] if len(tried) > LEDGER_MAX else []),
        "recent": recent,
        "rules": rules.view(),
        "device": fb.run_device(rules, ctx.attempts),
        "retime_notes": fb.retime_notes(ctx.attempts),
        "feedback": feedback.strip("\n"),
        "whole_file": whole_file,
        "edit_failures": edit_failures,
        "memory": memory_view(ctx.memory),
        "tree": _tree_view(ctx),
        "on_cpu": on_cpu(ctx),
        # the static scan's rule, told before a rejection costs a step (a model met it only after one)
        "allowed_imports": sorted(ALLOWED_IMPORTS - {"__future__"}) if ctx.language is not Language.CUDA else [],
    }


def build_messages(ctx: PlannerContext, feedback: str = "", whole_file: bool = False,
                   edit_failures: int = 0, rules: Optional[Rules] = None) -> list[dict]:
    variables = prompt_vars(ctx, feedback, whole_file, edit_failures, rules)
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
