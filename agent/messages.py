"""What the orchestrator asks of a worker process, and how the worker answers.

The answer travels on a private pipe whose file descriptor only the worker's harness knows; every message
carries the per-run nonce. The candidate's own stdout and stderr go to log files and are never parsed. Each
message kind is a model of one union: a line that is not one of them, exactly, is not the harness's.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from optagent.enums import Phase  # noqa: F401 (the phases workers report, here with the messages)
from optagent.schema import CaseKind, Device, FloorKind, GpuFacts, KernelFacts, Language, Record, Status, Timing


class CaseSpec(Record):
    label: str
    kind: CaseKind
    index: Optional[int] = None  # contest cases: the 1-based index fed to getTestCaseSize
    params: Optional[dict] = None  # smoke/hidden cases: passed to hooks.make_case
    max_elements: Optional[int] = None  # a smoke case cut from a contest case (no manifest): its leading dimension


class TimingSpec(Record):
    min_iters: int = 80  # not 20: a loop of 20 now and then read a case 10-60% slow (docs/gpu.md, 2026-12-07)
    max_iters: int = 200
    budget_s: float = 0.3  # per case and per timed callable
    input_sets: int = 3  # rotated fresh float inputs (keeps L2 and caches honest)
    warmup: int = 10  # GPU clocks and caches settle before the first timed call
    graphs: bool = False  # also time CUDA-graph replays (settings' graph_timing): a display figure, never scored


class Part(BaseModel):
    """A piece of a message: strict, so that a line with anything unexpected is not the harness's."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Sample(Part):
    """One saved output of the candidate, and the seeds the judge rebuilds its inputs from."""

    name: str
    base_seed: Optional[int] = None
    refresh_seed: Optional[int] = None
    file: str
    sha256: str
    fd: Optional[int] = None  # judge: the descriptor the parent opened the file by (evaluation/safe_files.py)


class NativeTimerSpec(Part):
    """The native timer the parent built and checked (evaluation/native_build.py)."""

    path: str
    sha256: str


class ExpectedSample(Part):
    """A saved output the judge must find, with the seeds the parent (not the candidate) derived."""

    name: str
    base_seed: Optional[int] = None
    refresh_seed: Optional[int] = None
    inputs: bool = False  # its post-call inputs were saved too, to be compared bitwise
    digest: Optional[str] = None  # the outputs' sha256 the harness told the referee when the call returned


class Job(Record):
    # baseline: the baselines alone, no candidate; profile: the candidate under ncu (--profile)
    mode: Literal["candidate", "judge", "probe", "baseline", "profile"]
    task_dir: str
    device: Device
    language: Optional[Language] = None
    source_path: Optional[str] = None
    cases: list[CaseSpec] = Field(default_factory=list)
    seed: int = 0
    nonce: str
    scratch: str
    timing: TimingSpec = Field(default_factory=TimingSpec)
    compiler: Optional[list[str]] = None
    compile_timeout_s: float = 180.0
    outputs_dir: Optional[str] = None  # where the candidate saves outputs for the judge
    samples: dict[str, list[Sample]] = Field(default_factory=dict)  # judge: saved outputs per case
    source_fp8: bool = False  # judge: the candidate's source names an fp8 type (interpreter_faults)
    source_dot: bool = False  # judge: the candidate's source calls a dot (interpreter_faults)
    time_baseline: bool = True  # candidate: time the baselines first (off where a pool times them once per lane)
    retime: bool = False  # candidate: timing only, no checked run, nothing saved (a re-time: search/accept.py)
    shared_checks: bool = False  # candidate: its correctness runs hold the lane shared (evaluation/lanes.py)
    timer: Optional[NativeTimerSpec] = None  # candidate: the native timer (None: the Python one)
    expected: dict[str, list[ExpectedSample]] = Field(default_factory=dict)  # judge: samples that must exist
    guard: bool = True  # candidate: the in-process guard (worker/guard.py); off only in tests of the OS's containment
    target_facts: bool = False  # candidate, CPU mode: Triton launches also compiled for the target GPU
    gate_fd: Optional[int] = None  # a warm candidate: its lane's gate, sent with the job (evaluation/warm_worker.py)
    stored_cases: bool = False  # slow cases kept in the cache (worker/case_store.py): only under a read-only file system


class Message(Part):
    nonce: str = ""  # Channel.send stamps the run's nonce


class Hello(Message):
    type: Literal["hello"] = "hello"
    baseline_label: str
    device_name: str
    gpu: Optional[GpuFacts] = None
    import_s: Optional[float] = None  # the worker's own start-up until this message: torch, the task package


class PhaseStarted(Message):
    """For live progress only: verdicts never rest on it."""

    type: Literal["phase"] = "phase"
    phase: Phase
    case: Optional[str] = None


class LaneWanted(Message):
    """The harness is about to time or (Phase.CASE, Job.shared_checks) to check the kernel: it waits for its lane
    where the parent gave it a gate (evaluation/gates.py), and tells the phase's start either way."""

    type: Literal["lane_wanted"] = "lane_wanted"
    phase: Phase


class LaneReleased(Message):
    type: Literal["lane_released"] = "lane_released"
    phase: Phase


class Baseline(Message):
    type: Literal["baseline"] = "baseline"
    case: str
    timing: Timing
    sizes: str
    # set by the parent, never from a worker: the harness's own time under the referee (evaluation/referee_log.py)
    over_us: Optional[float] = None
    between_us: Optional[float] = None


class Compiled(Message):
    """The kernel's preparation: PASSED, or why it cannot run at all."""

    type: Literal["compile"] = "compile"
    status: Status
    reason: Optional[str] = None

    @model_validator(mode="after")
    def _reasoned(self) -> "Compiled":
        if self.status is not Status.PASSED and not self.reason:
            raise ValueError(f"compile status {self.status.value} needs a reason")
        return self


class CaseStart(Message):
    type: Literal["case_start"] = "case_start"
    case: str


class CaseRan(Message):
    """The kernel ran on the case (a claim: the judge checks the samples); hidden cases are not timed."""

    type: Literal["case_ran"] = "case_ran"
    case: str
    samples: list[Sample]
    load_ms: float
    timing: Optional[Timing] = None  # eager
    gpu: Optional[Timing] = None  # CUDA-graph replay (or events)
    gpu_note: Optional[str] = None
    kernels: list[KernelFacts] = Field(default_factory=list)
    # the package's check() failed the kernel's output on the case's own inputs, in this process: not timed
    # (nothing else is), the judge has the last word; a PASSED from it is a contradiction (verdict.py)
    untimed: bool = False


class CaseFailed(Message):
    type: Literal["case_failed"] = "case_failed"
    case: str
    status: Status
    reason: str
    kernels: list[KernelFacts] = Field(default_factory=list)  # e.g. a CUDA source compiled on a CPU, never run

    @model_validator(mode="after")
    def _failed(self) -> "CaseFailed":
        if self.status is Status.PASSED:
            raise ValueError("a failed case cannot be PASSED")
        return self


class Integrity(Message):
    type: Literal["integrity"] = "integrity"
    reason: str


class Finding(Part):
    """What the judge found comparing outputs with its reference."""

    status: Status
    reason: Optional[str] = None
    rel_err: Optional[float] = None
    max_abs_err: Optional[float] = None
    tolerance: Optional[float] = None

    @model_validator(mode="after")
    def _reasoned(self) -> "Finding":
        if self.status is not Status.PASSED and not self.reason:
            raise ValueError(f"finding {self.status.value} needs a reason")
        return self


class Verdict(Finding, Message):
    """The judge's word on one case."""

    type: Literal["verdict"] = "verdict"
    case: str
    floor_us: Optional[float] = None  # bytes moved / measured bandwidth
    floor_kind: Optional[FloorKind] = None
    compute_floor_us: Optional[float] = None


class ProbedCase(Part):
    index: int
    sizes: list[list[int]]
    warmup: int
    iters: int
    elements: int


class ProbedExtra(Part):
    """A manifest (smoke or hidden) case, generated and referenced once."""

    label: str
    sizes: str
    bytes: Optional[int] = None


class Probed(Message):
    type: Literal["probe"] = "probe"
    cases: list[ProbedCase]
    outputs: list[int]
    inouts: list[int] = Field(default_factory=list)  # written in place (worker/arg_roles.py)
    baseline_label: str
    probed_case: int
    extra: list[ProbedExtra] = Field(default_factory=list)


class WorkerError(Message):
    """The worker's own code raised (the candidate's exceptions reach here too)."""

    type: Literal["error"] = "error"
    error: str
    traceback: str = ""


class Done(Message):
    type: Literal["done"] = "done"


AnyMessage = Annotated[Union[Hello, PhaseStarted, Baseline, Compiled, CaseStart, CaseRan, CaseFailed, Integrity,
                             Verdict, Probed, WorkerError, Done, LaneWanted, LaneReleased],
                       Field(discriminator="type")]
_MESSAGE: TypeAdapter[AnyMessage] = TypeAdapter(AnyMessage)
M = TypeVar("M", bound=Message)


class Channel:
    """Writer side of the result pipe (worker)."""

    def __init__(self, fd: int, nonce: str):
        self._fd = fd
        self._nonce = nonce

    def send(self, message: Message) -> None:
        data = message.model_copy(update={"nonce": self._nonce}).model_dump_json().encode() + b"\n"
        while data:
            n = os.write(self._fd, data)
            data = data[n:]


def parse_line(line: bytes | str, nonce: str) -> Optional[Message]:
    """One line of the pipe as a message of this run, or None (not JSON, not a message, another nonce)."""
    try:
        msg = _MESSAGE.validate_json(line)
    except (ValidationError, ValueError):
        return None
    return msg if msg.nonce == nonce else None


def parse_messages(raw: bytes, nonce: str) -> tuple[list[Message], int]:
    """Messages from the pipe, and how many lines were not the harness's (forged or garbled)."""
    out: list[Message] = []
    dropped = 0
    for line in raw.decode(errors="replace").splitlines():
        msg = parse_line(line, nonce)
        if msg is None:
            dropped += 1
        else:
            out.append(msg)
    return out, dropped
