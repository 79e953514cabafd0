"""The compiler's report on one kernel, a part of schema.CaseResult (kept apart: schema.py is long)."""

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
