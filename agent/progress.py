"""Live progress of a step: typed events, and how the worker's pipe messages become them.

An evaluation takes from seconds to minutes; its phases (the worker starting, the
baseline timed, the kernel compiled, each case run and timed, the judge) reach
the orchestrator as they happen, as messages on the worker's result pipe. Only
harness code sends them. They are for display: the result is assembled from the
full message list once the worker has exited, never from these events.
"""

from __future__ import annotations

import enum
import threading
from typing import Optional, Protocol

from optagent.messages import CaseSpec, CaseStart, Message, Phase, PhaseStarted
from optagent.schema import CaseKind, Record


class Subject(str, enum.Enum):
    """Which kernel an evaluation is about."""

    CANDIDATE = "candidate"
    INCUMBENT_RETIME = "incumbent-retime"  # the best so far, timed again back to back with a candidate
    CANDIDATE_RETIME = "candidate-retime"


class Progress(Record):
    phase: Phase
    subject: Subject = Subject.CANDIDATE
    step: Optional[int] = None
    case: Optional[str] = None  # the case label
    index: Optional[int] = None  # 1-based position of the case among `total`
    total: Optional[int] = None


class ProgressSink(Protocol):
    def __call__(self, event: Progress) -> None: ...


def stamped(sink: Optional[ProgressSink], **fields) -> Optional[ProgressSink]:
    """A sink that adds fields (the step, the subject) to every event before passing it on."""
    if sink is None:
        return None

    def stamp(event: Progress) -> None:
        sink(event.model_copy(update=fields))
    return stamp


def serialised(sink: Optional[ProgressSink]) -> Optional[ProgressSink]:
    """Progress from several threads (a pool's evaluations), one event at a time."""
    if sink is None:
        return None
    lock = threading.Lock()

    def one(event: Progress) -> None:
        with lock:
            sink(event)
    return one


class PipeRelay:
    """Turns a worker's pipe messages into Progress events, with the case's place in its list."""

    def __init__(self, sink: ProgressSink, cases: list[CaseSpec]):
        self.sink = sink
        self.all = [c.label for c in cases]
        self.timed = [c.label for c in cases if c.kind is not CaseKind.HIDDEN]  # baselines are timed on these
        self.judged = self.all

    def judging(self, ran: list[CaseSpec]) -> None:
        self.judged = [c.label for c in ran]
        self.sink(Progress(phase=Phase.JUDGING, total=len(ran)))

    def __call__(self, msg: Message) -> None:
        if isinstance(msg, CaseStart):
            phase, case = Phase.CASE, msg.case
        elif isinstance(msg, PhaseStarted):
            phase, case = msg.phase, msg.case
        else:
            return
        labels = {Phase.BASELINE: self.timed, Phase.JUDGING: self.judged}.get(phase, self.all)
        index = labels.index(case) + 1 if case in labels else None
        self.sink(Progress(phase=phase, case=case if index else None, index=index,
                           total=len(labels) if index else None))


# What each phase and subject reads as, in the CLI's live line and the MCP server's progress notes.
PHASE_TEXT = {
    Phase.PROPOSING: "the planner is proposing a kernel",
    Phase.STARTING: "starting the worker",
    Phase.BASELINE: "timing the baseline",
    Phase.COMPILING: "compiling",
    Phase.CASE: "running case",
    Phase.TIMING: "timing case",
    Phase.JUDGING: "judging",
    Phase.PROFILING: "profiling under ncu",
}
SUBJECT_TEXT = {Subject.INCUMBENT_RETIME: "re-timing the incumbent",
                Subject.CANDIDATE_RETIME: "re-timing the candidate"}


def describe(event: Progress, step_s: float, phase_s: float) -> str:
    """'step 3: re-timing the incumbent: timing case 2/4 (smoke-2) (12 s; step 40 s)'."""
    parts = [f"step {event.step}"] if event.step is not None else []
    if event.subject in SUBJECT_TEXT:
        parts.append(SUBJECT_TEXT[event.subject])
    what = PHASE_TEXT[event.phase]
    if event.index and event.total:
        what += (", case" if event.phase in (Phase.BASELINE, Phase.JUDGING) else "") + \
            f" {event.index}/{event.total} ({event.case})"
    elif event.phase is Phase.JUDGING and event.total:
        what += f" {event.total} case{'s' if event.total != 1 else ''}"
    parts.append(what)
    times = ([f"{phase_s:.0f} s"] if phase_s >= 1 else []) + \
        ([f"{'step' if event.step is not None else 'total'} {step_s:.0f} s"] if step_s - phase_s >= 1 else [])
    return ": ".join(parts) + (f" ({'; '.join(times)})" if times else "")
