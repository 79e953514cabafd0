"""The boundaries between the loop and what it drives (only app/build.py picks concrete classes): the
protocols, what crosses them (a pool's job, an LLM's reply, a planner's exceptions), and what a task
package's hooks module may define."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Protocol, Sequence, Union, runtime_checkable

from optagent.progress import ProgressSink
from optagent.schema import EvalResult, Language, Proposal, Step, Usage

if TYPE_CHECKING:  # records of the runs floor, named in annotations only: nothing here imports upward
    import torch

    from optagent.runs.memory import Recall
    from optagent.runs.view import PlannerContext


class PlannerExhausted(Exception):
    """The planner has nothing more worth trying."""


class PlannerWaiting(Exception):
    """The planner's proposals come from outside (an agent), and it has none now: the run pauses."""


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

    def evaluate(self, source: str, language: Language, progress: Optional[ProgressSink] = None,
                 stop: Optional[threading.Event] = None) -> EvalResult:
        """progress, when given, hears each phase as it starts (agent/progress.py); it may be ignored. stop, once
        set, ends the evaluation (its processes killed), which then raises (cli/language.py: a run's deadline)."""
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
