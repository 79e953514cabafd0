"""What ncu measured of a result's cases (--profile), as prompts/profile.j2 renders it: one row per case.

Figures only, formatted; the words are the template's. Hidden cases are never shown, and a case
whose profile did not come (no ncu, no counters, a failure) has no row: the prompt would gain a
line the model cannot act on.
"""

from __future__ import annotations

from typing import Any, Optional

from optagent.profile_facts import ProfileStatus
from optagent.schema import CaseKind, EvalResult


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def profile_rows(result: Optional[EvalResult]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in result.cases if result else []:
        p = c.profile
        if c.kind is CaseKind.HIDDEN or p is None or p.status is not ProfileStatus.PROFILED:
            continue
        rows.append({
            "case": c.case,
            "bound": p.bound.value if p.bound else "",
            "dram": _pct(p.dram_pct), "sm": _pct(p.sm_pct), "occupancy": _pct(p.occupancy_pct),
            "floor_pct": _pct(p.floor_pct) if p.floor_pct is not None else "",
            "floor_bound": c.bound or "",
            "stalls": [{"reason": s.reason, "share": f"{100 * s.share:.0f}"} for s in p.stalls],
            "count": p.kernel_count,
            "kernels": [{"name": k.name, "us": "-" if k.duration_us is None else f"{k.duration_us:.1f}"}
                        for k in p.kernels],
        })
    return rows
