"""The boundaries between the loop and what it drives; only the CLI picks concrete classes."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional, Protocol, Sequence, Union, runtime_checkable

from optagent.progress import ProgressSink
from optagent.schema import EvalResult, Language, Proposal, Step, Usage

if TYPE_CHECKING:
    from optagent.search.memory import Recall


class PlannerExhausted(Exception):
    """The planner has nothing more worth trying."""


class PlannerWaiting(Exception):
    """The planner's proposals come from outside (an agent), and it has none now: the run pauses."""


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


@dataclass
class GpuFacts:
    name: str
    sm_count: Optional[int] = None
    l2_mb: Optional[float] = None
    bandwidth_gbs: Optional[float] = None
    smem_per_sm_kb: Optional[float] = None
    bf16_tflops: Optional[float] = None  # measured matrix-product rate


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


@dataclass
class LLMReply:
    text: str  # the answer, without the reasoning of a reasoning model
    usage: Usage
    reasoning: str = ""


@runtime_checkable
class Planner(Protocol):
    name: str
    model: Optional[str]

    def propose(self, ctx: PlannerContext) -> Proposal:
        """Return the next kernel to try; raise PlannerExhausted when done."""
        ...


SlotOutcome = Union[Proposal, Exception]


@runtime_checkable
class RoundPlanner(Planner, Protocol):
    """A planner that proposes a round's candidates together (the LLM's requests at once)."""

    def propose_round(self, ctxs: list[PlannerContext]) -> list[SlotOutcome]:
        """One outcome per context, in order: a Proposal, or the exception its slot raised
        (PlannerExhausted: nothing more for that slot)."""
        ...


@runtime_checkable
class Memory(Protocol):
    """Memory across runs (search/memory.py): each committed step goes in, earlier runs' findings come out."""

    def record(self, step: Step) -> None: ...

    def recall(self) -> Optional[Recall]: ...

    def summary(self) -> str:
        """One line for the run's header: where the ledger is and what it holds."""
        ...


@runtime_checkable
class LLM(Protocol):
    model: str

    def complete(self, messages: list[dict]) -> LLMReply: ...


@runtime_checkable
class Evaluator(Protocol):
    device: str

    def evaluate(self, source: str, language: Language, progress: Optional[ProgressSink] = None) -> EvalResult:
        """progress, when given, hears each phase as it starts (agent/progress.py); it may be ignored."""
        ...


@dataclass(frozen=True)
class PoolJob:
    """One kernel to evaluate in a round; key is the loop's own (its step index)."""

    key: int
    source: str
    language: Language


@runtime_checkable
class Pool(Protocol):
    """Evaluates a round's kernels, several at once where it can.

    The engine behind it (local processes, or a Ray cluster's actors: --cluster ray) is the builder's choice.
    lanes is the number of timing lanes: one per GPU it times on, timing serialised per lane.
    """

    lanes: int

    def evaluate(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None
                 ) -> Iterator[tuple[PoolJob, EvalResult]]:
        """Yields each job's result as soon as it is known, in any order; every job exactly once."""
        ...

    def retime(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None) -> list[EvalResult]:
        """Evaluates the jobs back to back on one timing lane, in order: the comparisons that decide
        acceptance are made on one GPU."""
        ...


class TaskHooks(Protocol):
    """What a task package's hooks module (optagent.toml ``task.hooks``) may define.

    The package defines them as module-level functions (no ``self``); HOOK_RULES says which
    are required. Workers call them only through ``optagent.worker.hooks.Hooks``, which checks
    the module against this protocol once, when it is loaded.
    """

    def make_case(self, params: dict, device: str, seed: int) -> list:
        """The run_kernel argument list of a [[smoke]]/[[hidden]] case, deterministic in seed."""
        ...

    def reference(self, args: list, dtype: torch.dtype) -> list:
        """The outputs (task.outputs order) computed by plain PyTorch in dtype; args untouched."""
        ...

    def bytes_moved(self, args: list) -> int:
        """The fewest bytes a kernel must move through device memory."""
        ...

    def flops(self, args: list) -> int:
        """The useful (matrix-product) flops of the case."""
        ...

    def describe(self, args: list) -> str:
        """A one-line size summary for tables."""
        ...


class HookNeed(str, enum.Enum):
    ALWAYS = "always"  # any package that declares a hooks module
    WITH_CASES = "with_cases"  # a manifest with [[smoke]] or [[hidden]] cases
    OPTIONAL = "optional"


@dataclass(frozen=True)
class HookRule:
    need: HookNeed
    purpose: str  # what optagent uses it for, said when it is missing


HOOK_RULES: dict[str, HookRule] = {
    "make_case": HookRule(HookNeed.WITH_CASES, "builds the inputs of the manifest's cases"),
    "reference": HookRule(HookNeed.ALWAYS, "the judge's reference outputs and tolerance, on every case"),
    "bytes_moved": HookRule(HookNeed.OPTIONAL, "a case's memory floor on a GPU"),
    "flops": HookRule(HookNeed.OPTIONAL, "a case's compute floor on a GPU"),
    "describe": HookRule(HookNeed.OPTIONAL, "the sizes column of tables; default: the first two shapes"),
}


def redact(step: Step, source: Optional[str] = None) -> Attempt:
    """A step as the planner may see it: hidden integrity cases reduced to a verdict."""
    result, error, hidden_failed = step.result, step.error, 0
    if result is not None:
        from optagent.schema import CaseKind

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
    return Attempt(step.index, step.idea, step.outcome.value, error, result, source, step.retime_note, hidden_failed)
