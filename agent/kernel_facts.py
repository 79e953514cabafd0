"""Hardware facts: the device a result was measured on (GpuFacts) and the compiler's report on each kernel
(KernelFacts); parts of schema.EvalResult and CaseResult."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict


class KernelFacts(BaseModel):
    """What the compiler reported for one kernel of a candidate (worker/compiler_facts.py)."""

    model_config = ConfigDict(extra="forbid")
    format_version: int = 1

    name: str
    source: Literal["triton", "ptxas", "cuobjdump"]
    registers: Optional[int] = None  # per thread
    spill_bytes: Optional[int] = None  # local memory per thread: spilled registers (and local arrays)
    shared_bytes: Optional[int] = None  # static shared memory per block
    warps: Optional[int] = None
    stages: Optional[int] = None
    occupancy: Optional[float] = None  # theoretical: resident warps / the SM's 64, 0..1
    target: Optional[str] = None  # "sm_90": compiled for a GPU this machine lacks (CPU mode); it never ran there


class GpuFacts(BaseModel):
    """The device a result was measured on: what the worker reads and measures once per GPU model."""

    model_config = ConfigDict(extra="forbid")

    name: str
    sm_count: Optional[int] = None
    l2_mb: Optional[float] = None
    bandwidth_gbs: Optional[float] = None
    smem_per_sm_kb: Optional[float] = None
    bf16_tflops: Optional[float] = None  # measured matrix-product rate
