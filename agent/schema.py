"""Every record optagent writes or passes between processes.

Each record is a pydantic model carrying a format version; statuses are enums and a record is validated against
its status (a PASSED case has a time, a failed one has a reason), so no magic values such as ``time_us=-1`` exist.
"""

from __future__ import annotations

import enum
import math
from datetime import datetime, timezone
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from optagent.enums import (SEVERITY, CaseKind, ClusterEngine, Device, FloorKind, Language, PlannerKind,  # noqa: F401
                            RunStatus, Status, StepOutcome, TimerKind, Word)
from optagent.kernel_facts import GpuFacts, KernelFacts  # noqa: F401 (parts of EvalResult and CaseResult)
from optagent.profile_facts import CaseProfile  # noqa: F401 (likewise)
from optagent.costs import Costs

# 2: every step commits its parent, its round and any change of the best (BestRef); runs of version 1, made
# before step commits and rounds, are refused by name (runs/store.py) rather than read by legacy branches.
FORMAT_VERSION = 2


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: int = FORMAT_VERSION

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data):
        # Derived values are written for readers of the JSON; reading back recomputes them.
        if isinstance(data, dict) and cls.model_computed_fields:
            data = {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data


class Timing(Record):
    """Robust statistics of repeated measurements, in microseconds."""

    median_us: float = Field(gt=0)
    p10_us: float = Field(gt=0)
    p90_us: float = Field(gt=0)
    samples: int = Field(ge=1)
    # eager timings: calls left out because the host ran slow then (host_speed.py), and
    # whether too many were, so that all calls count and the host's speed is in the figure
    slow_host_calls: int = Field(0, ge=0)
    host_slow: bool = False
    after_us: Optional[float] = Field(None, ge=0)  # the harness's work between timed calls (timer_check.py)

    @property
    def spread(self) -> float:
        """Relative half-width of the 10-90 band: the noise of this timing."""
        return (self.p90_us - self.p10_us) / (2 * self.median_us)


class CaseResult(Record):
    case: str  # "3" for contest case 3 (1-based as the contest counts), "smoke-1", "hidden-2"
    kind: CaseKind
    status: Status
    reason: Optional[str] = None
    sizes: Optional[str] = None  # human summary of the case's shapes
    rel_err: Optional[float] = None  # ||out - ref|| / ||ref|| against the reference
    max_abs_err: Optional[float] = None
    tolerance: Optional[float] = None  # rel_err bound the case was held to
    time_us: Optional[float] = None  # eager run_kernel time, median; never far below referee_us (evaluation/referee.py)
    gpu_us: Optional[float] = None  # CUDA-graph replay time, median
    baseline_us: Optional[float] = None
    referee_us: Optional[float] = None
    time: Optional[Timing] = None
    baseline: Optional[Timing] = None
    floor_us: Optional[float] = None  # bytes moved / measured bandwidth
    floor_kind: Optional[FloorKind] = None  # where the bytes came from: a hook, or an estimate
    compute_floor_us: Optional[float] = None  # useful flops / measured bf16 matmul rate
    load_ms: Optional[float] = None  # cost of loading a fresh copy of the candidate
    timing_kind: Optional[Literal["cuda", "cpu-interpreter", "cpu"]] = None
    kernels: list[KernelFacts] = Field(default_factory=list)  # what the compiler reported, where it did
    profile: Optional[CaseProfile] = None  # what ncu measured (--profile), where it ran

    @computed_field  # type: ignore[prop-decorator]
    @property
    def speedup(self) -> Optional[float]:
        if self.time_us and self.baseline_us:
            return self.baseline_us / self.time_us
        return None

    @property
    def hw_floor_us(self) -> Optional[float]:
        """The larger of the memory and the compute floor: no kernel runs much faster."""
        floors = [f for f in (self.floor_us, self.compute_floor_us) if f]
        return max(floors) if floors else None

    @property
    def bound(self) -> Optional[str]:
        """Which floor is the larger: "memory" or "compute"."""
        if not self.hw_floor_us:
            return None
        return "compute" if self.compute_floor_us == self.hw_floor_us else "memory"

    @property
    def pct_of_floor(self) -> Optional[float]:
        if self.hw_floor_us and self.time_us:
            return 100.0 * self.hw_floor_us / min(self.time_us, self.gpu_us or self.time_us)
        return None

    @model_validator(mode="after")
    def _consistent(self) -> "CaseResult":
        if self.status is not Status.PASSED and not self.reason:
            raise ValueError(f"case {self.case}: status {self.status.value} needs a reason")
        for name in ("rel_err", "max_abs_err", "time_us", "gpu_us", "baseline_us"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"case {self.case}: {name} must be finite, got {value}")
        return self


class Mechanism(str, enum.Enum):
    BWRAP = "bwrap"  # bubblewrap: namespaces, a read-only file system, a private /tmp and /proc
    UNSHARE = "unshare"  # util-linux unshare: namespaces only, the file system stays writable
    LANDLOCK = "landlock"  # Landlock: all but the scratch directory read-only (unshare's namespaces where they work)
    NONE = "none"


class Isolation(Record):
    """What the OS kept from the candidate process (evaluation/isolation.py); by default none, as before."""

    mechanism: Mechanism = Mechanism.NONE
    user_ns: bool = False  # its own user namespace, mapped to an unprivileged uid
    pid_ns: bool = False  # its own PID namespace: nothing it starts outlives it, no other /proc
    no_network: bool = False
    ro_fs: bool = False  # read-only file system apart from its scratch directory
    memory_gib: Optional[float] = None  # limits the parent enforced: host memory,
    tasks: Optional[int] = None  # processes and threads,
    output_mib: Optional[int] = None  # stdout and stderr


class EvalResult(Record):
    status: Status
    reason: Optional[str] = None
    language: Language
    device: Device
    device_name: Optional[str] = None
    source_sha256: str
    baseline_label: Optional[str] = None  # e.g. "flash_attn (optagent PyTorch stand-in)"
    cases: list[CaseResult] = Field(default_factory=list)
    wall_s: float = Field(ge=0)
    log_tail: Optional[str] = None  # candidate stderr tail, for the planner
    gpu: Optional[GpuFacts] = None  # the device measured on
    isolation: Isolation = Field(default_factory=Isolation)
    costs: Optional[Costs] = None
    timer: TimerKind = TimerKind.PYTHON  # what took the timings (before it was recorded: the Python one)
    timed_on: Optional[str] = None  # the pool's lane (a GPU, a cluster actor) that timed it: search/accept.py
    killed_from_outside: bool = False  # its candidate process ended by a signal not the parent's: evaluated again

    @model_validator(mode="after")
    def _consistent(self) -> "EvalResult":
        if self.status is not Status.PASSED and not self.reason:
            raise ValueError(f"status {self.status.value} needs a reason")
        if self.status is Status.PASSED and any(not c.status.ok for c in self.cases):
            raise ValueError("status PASSED with a failed case")
        return self

    @property
    def on_cpu(self) -> bool:
        """Timed by the CPU (Triton's interpreter): its figures say the kernel works, not how fast it is."""
        return self.device is Device.CPU or any(c.timing_kind in ("cpu-interpreter", "cpu") for c in self.cases)

    @property
    def timed(self) -> list[CaseResult]:
        return [c for c in self.cases if c.kind is not CaseKind.HIDDEN and c.time_us]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def geomean_speedup(self) -> Optional[float]:
        ups = [c.speedup for c in self.timed if c.speedup]
        if not ups or self.status is not Status.PASSED:
            return None
        return math.exp(sum(math.log(u) for u in ups) / len(ups))

    @property
    def geomean_time_us(self) -> Optional[float]:
        ts = [c.time_us for c in self.timed]
        if not ts or self.status is not Status.PASSED:
            return None
        return math.exp(sum(math.log(t) for t in ts) / len(ts))


def worst(statuses: list[Status]) -> Status:
    present = set(statuses)
    for status in SEVERITY:
        if status in present:
            return status
    return Status.PASSED


class Usage(Record):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0  # LLM requests these tokens were spent on (a step's repairs are requests too)

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            requests=self.requests + other.requests,
        )


class Proposal(Record):
    """What a planner returns: a kernel to evaluate, or the reason there is none."""

    source: Optional[str] = None
    idea: str  # one line: what this attempt tries, for the ledger
    error: Optional[str] = None  # why the reply gave no usable kernel
    request: Optional[list[dict]] = None  # the messages sent, for the run record
    reply: Optional[str] = None
    usage: Usage = Field(default_factory=Usage)
    meta: dict = Field(default_factory=dict)  # planner-private state (knob values...)
    parent: Optional[int] = None  # the step whose kernel the planner was given to improve (None: the starter)
    round: Optional[int] = None  # the round it was proposed in

    @model_validator(mode="after")
    def _one_of(self) -> "Proposal":
        if (self.source is None) == (self.error is None):
            raise ValueError("a proposal carries either a source or an error")
        return self


class BestRef(Record):
    """The run's best kernel as a step left it: committed inside that step's record, so the two never disagree."""
    step: int = Field(ge=0)  # the step whose candidate is the best kernel
    result: EvalResult  # its latest timing (the first, or a re-time side by side with a later candidate)
    seq: int = Field(ge=0)  # steps committed before this one: the highest names the run's best (gaps re-run late)


class Step(Record):
    index: int = Field(ge=0)
    started_at: datetime
    finished_at: datetime
    idea: str
    outcome: StepOutcome
    candidate_sha256: Optional[str] = None
    result: Optional[EvalResult] = None
    error: Optional[str] = None
    usage: Usage = Field(default_factory=Usage)
    best_geomean_speedup: Optional[float] = None
    retime_note: Optional[str] = None
    best: Optional[BestRef] = None  # set when this step changed the best kernel or its timing
    parent: Optional[int] = None  # the step whose kernel it was derived from (None: the starter)
    round: Optional[int] = None  # proposed together with the other steps of this round


class RunConfig(Record):
    run_id: str
    task_dir: str
    task_name: str
    task_digest: str
    language: Language
    language_reason: Optional[str] = None  # why this language: --language, or the fastest starter
    device: Device
    planner: PlannerKind
    model: Optional[str] = None
    base_url: Optional[str] = None
    replay_file: Optional[str] = None
    request_timeout_s: float = 600.0  # per LLM request
    max_tokens: Optional[int] = None  # of a reply (the server's default when None)
    temperature: Optional[float] = None
    compiler: Optional[str] = None
    cases: Optional[str] = None
    hidden: bool = True
    profile: bool = False  # --profile: each passing candidate profiled once under ncu (evaluation/profiler.py)
    fresh: bool = False  # --fresh: nothing recalled from the task's ledger (the run is still recorded in it)
    timeout_s: float
    min_gain: float
    patience: int
    max_steps: int
    width: int = Field(1, ge=1)  # candidates proposed and evaluated per round
    time_limit_s: Optional[float] = None
    budget_usd: Optional[float] = None
    cluster: ClusterEngine = ClusterEngine.LOCAL  # --cluster: where candidates are evaluated
    cluster_address: Optional[str] = None  # --cluster ray=ADDRESS (None: a local Ray instance)
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))


class RunState(Record):
    status: RunStatus
    reason: Optional[str] = None  # why the run stopped (absent in state files written before it existed)
    steps: int
    best_step: Optional[int] = None
    best_geomean_speedup: Optional[float] = None
    usage: Usage = Field(default_factory=Usage)
    updated_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))


def now() -> datetime:
    return datetime.now(timezone.utc)
