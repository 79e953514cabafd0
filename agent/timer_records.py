"""The native timer's records (worker/native/timer.c), as the parent reads them off the report pipe.

Each line is the parent's secret in hex, a space, and one JSON record that timer.c wrote
itself with one write() of at most PIPE_BUF bytes: a ``start`` when a timing loop begins and
an ``end`` with its statistics, its duration by the timer's own clock and the timed calls
whose outputs the judge must check. Also here: the seeds of every saved output, which the
candidate process and the parent both derive from the job (the parent's copy is the one
the judge uses).
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, TypeAdapter, ValidationError

from optagent.messages import CaseSpec, ExpectedSample, Job, Part
from optagent.schema import CaseKind

SET_SEED_STEP = 7919  # input set k of a timed case starts from job.seed + 7919 * k
FRESH_SEED = 104729


class LoopKind(str, enum.Enum):
    BASELINE = "baseline"
    EAGER = "eager"
    GPU = "gpu"  # CUDA-graph replays, or events around the call


class TimerStart(Part):
    type: Literal["start"] = "start"
    seq: int
    case: str
    kind: LoopKind


class TimerEnd(Part):
    type: Literal["end"] = "end"
    seq: int
    case: str
    kind: LoopKind
    median_us: float = Field(gt=0)
    p10_us: float = Field(gt=0)
    p90_us: float = Field(gt=0)
    samples: int = Field(ge=1)  # the calls the statistics are of (those at the host's usual speed)
    calls: int = Field(ge=1)  # all timed calls
    host_slow: bool
    slow_host_calls: int = Field(ge=0)
    loop_s: float = Field(ge=0)  # warm-up and timed calls, by the timer's own clock
    after_us: float = Field(ge=0)  # low decile of the harness's `after` interval per timed call (0: none ran)
    n_keep: int = Field(ge=0)
    check: list[tuple[int, int, Optional[int]]]  # (call number, input set, refresh seed or None)


TimerRecord = Annotated[Union[TimerStart, TimerEnd], Field(discriminator="type")]
_RECORD: TypeAdapter[TimerRecord] = TypeAdapter(TimerRecord)


@dataclass(frozen=True)
class Stamped:
    """A record and when the parent read it (time.monotonic)."""

    record: Union[TimerStart, TimerEnd]
    at: float


def parse_reports(lines: list[tuple[float, bytes]], secret: bytes) -> tuple[list[Stamped], int]:
    """The records of the report pipe, and how many lines were not the timer's."""
    key = secret.hex().encode()
    out: list[Stamped] = []
    foreign = 0
    for at, line in lines:
        head, _, body = line.partition(b" ")
        if not hmac.compare_digest(head, key):
            foreign += 1
            continue
        try:
            out.append(Stamped(_RECORD.validate_json(body), at))
        except (ValidationError, ValueError):
            foreign += 1
    return out, foreign


def set_seed(job: Job, k: int) -> int:
    return job.seed + SET_SEED_STEP * k


def checked_seeds(job: Job, n: int, case: CaseSpec) -> list[tuple[str, Optional[int]]]:
    """The base seeds of case n's checked runs: the package's own inputs ("given"; manifest
    cases have none of their own, so drawn ones), then fresh ones."""
    given = None if case.kind is CaseKind.CONTEST else job.seed + n
    return [("given", given), ("fresh", job.seed + FRESH_SEED + n)]


def expected_checked(job: Job) -> dict[str, list[ExpectedSample]]:
    """The given and fresh samples of every case, their post-call inputs saved with them."""
    return {case.label: [ExpectedSample(name=name, base_seed=seed, inputs=True)
                         for name, seed in checked_seeds(job, n, case)] for n, case in enumerate(job.cases)}


def timed_name(call: int) -> str:
    return f"timed-call{call}"
