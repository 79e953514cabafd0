"""The tree of kernels a run grew: each step's parent, and the lineage of a kernel back to the starter.

Each step records its parent (Step.parent): None for the starter, and for a step made from the starter's
source because no kernel had passed yet.
"""

from __future__ import annotations

from typing import Optional, Sequence

from optagent.schema import Step

def parents(steps: Sequence[Step]) -> dict[int, Optional[int]]:
    """Step index -> the index of the step its kernel came from (None: the starter's)."""
    return {s.index: s.parent for s in steps}


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
    """The step whose kernel is the run's best: named by the latest commit that changed it."""
    refs = [s.best for s in steps if s.best is not None]
    return max(refs, key=lambda r: r.seq).step if refs else None
