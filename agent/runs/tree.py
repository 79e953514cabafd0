"""The tree of kernels a run grew: each step's parent, and the lineage of a kernel back to the starter.

Steps record their parent (Step.parent). Runs made before rounds did not: each of their candidates was
derived from the best kernel of its time, so a step there has the latest BASELINE/ACCEPTED step before it
as its parent, which gives old runs the same lineage view.
"""

from __future__ import annotations

from typing import Optional, Sequence

from optagent.schema import Step

def parents(steps: Sequence[Step]) -> dict[int, Optional[int]]:
    """Step index -> the index of the step its kernel came from (None: the starter's)."""
    out: dict[int, Optional[int]] = {}
    best: Optional[int] = None
    for s in sorted(steps, key=lambda s: s.index):
        out[s.index] = s.parent if s.round is not None else (best if s.index > 0 else None)
        if s.outcome.keeps_best:
            best = s.index
    return out


def lineage(steps: Sequence[Step], index: int) -> list[Step]:
    """The steps from the root (the starter, step 0) down to ``index``; [] when no such step."""
    by_index = {s.index: s for s in steps}
    up = parents(steps)
    chain: list[Step] = []
    at: Optional[int] = index
    while at is not None and at in by_index and all(s.index != at for s in chain):  # a cycle would be damage
        chain.append(by_index[at])
        at = up.get(at)
    return chain[::-1]


def lineage_text(steps: Sequence[Step], index: Optional[int], ideas: bool = False) -> str:
    """'0 > 3 > 7' (with ideas: '0 the starter kernel > 3 ...'); '-' when there is no such step."""
    chain = lineage(steps, index) if index is not None else []
    if not chain:
        return "-"
    return " > ".join(f"{s.index} {s.idea}" if ideas else str(s.index) for s in chain)


def children(steps: Sequence[Step]) -> dict[int, int]:
    """How many steps were derived from each step."""
    out: dict[int, int] = {}
    for parent in parents(steps).values():
        if parent is not None:
            out[parent] = out.get(parent, 0) + 1
    return out


def best_step(steps: Sequence[Step]) -> Optional[int]:
    """The step whose kernel is the run's best: named by the latest commit that changed it (older runs: the
    last step that kept it)."""
    refs = [s.best for s in steps if s.best is not None]
    if refs:
        return max(refs, key=lambda r: r.seq).step
    return next((s.index for s in sorted(steps, key=lambda s: -s.index) if s.outcome.keeps_best), None)
