"""What Nsight Compute measured of one case, a part of schema.CaseResult (kept apart: schema.py is long).

Filled in by the trusted parent (evaluation/ncu_csv.py) from ncu's CSV, which the sandboxed
profile process wrote: every figure here is a reading for the planner, never a verdict or a timing.
"""

from __future__ import annotations

import enum
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ProfileStatus(str, enum.Enum):
    PROFILED = "PROFILED"
    NO_NCU = "NO_NCU"  # --profile asked, but no ncu on this machine
    NO_COUNTERS = "NO_COUNTERS"  # ncu ran but could not read the GPU's performance counters
    FAILED = "FAILED"  # the profile process or ncu failed, or its output did not parse


class Bound(str, enum.Enum):
    """The roofline reading of the profiled kernels (Nsight Compute's speed-of-light rule: a unit
    above 60% of its peak bounds the kernel; with neither, latency does)."""

    MEMORY = "memory"
    COMPUTE = "compute"
    LATENCY = "latency"


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfiledKernel(Part):
    name: str
    duration_us: Optional[float] = Field(None, ge=0)


class Stall(Part):
    reason: str  # ncu's name for it: long_scoreboard, wait, barrier, math_pipe_throttle...
    share: float = Field(ge=0, le=1)  # of all stalled warp-cycles of the case's kernels


class CaseProfile(Part):
    format_version: int = 1
    status: ProfileStatus
    reason: Optional[str] = None
    kernels: list[ProfiledKernel] = Field(default_factory=list)  # the longest first
    kernel_count: int = Field(0, ge=0)  # launches profiled (kernels lists at most a few)
    duration_us: Optional[float] = Field(None, ge=0)  # of all of them, as ncu measured them (not a timing)
    dram_pct: Optional[float] = Field(None, ge=0, le=100)  # achieved DRAM throughput, % of peak
    sm_pct: Optional[float] = Field(None, ge=0, le=100)  # SM (compute) throughput, % of peak
    occupancy_pct: Optional[float] = Field(None, ge=0, le=100)  # achieved: active warps / the SM's maximum
    stalls: list[Stall] = Field(default_factory=list)  # the top three
    bound: Optional[Bound] = None
    floor_pct: Optional[float] = Field(None, ge=0)  # the case's floor as a % of the profiled duration

    @model_validator(mode="after")
    def _consistent(self) -> "CaseProfile":
        if self.status is not ProfileStatus.PROFILED and not self.reason:
            raise ValueError(f"profile status {self.status.value} needs a reason")
        return self
