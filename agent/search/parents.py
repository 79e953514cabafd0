"""Which kernels a round's candidates start from: one stated rule, balancing the best against the rest.

The rule:
1. The nodes are the run's passing kernels (the starter when it passed, every candidate that passed).
2. They are ranked, best rank 1. On a GPU by recorded geomean time, fastest first, the incumbent (the run's
   best) always rank 1. On the CPU the interpreter's times rank nothing and the best stays the first kernel
   that passed: there the newest passing kernel is rank 1 and the others follow newest first (a newer kernel
   carries more of the run's ideas, and a line of work goes on from its last correct kernel).
3. Only the TOP best ranks compete. A node of rank r with c children weighs 1/r + EXPLORE_BONUS/(1 + c):
   rank favours the best, and a node nobody has built on yet gets a bonus that fades as children are added.
4. Slot 0 of every round is rank 1 (on a GPU the incumbent). The other slots are drawn by weight without replacement, then,
   once every node has a slot, with replacement (all nodes, the incumbent included).
5. The draw is seeded by the run's id and the round's number, so a resumed run draws the same parents.

Width 1 is always rank 1: on a GPU the incumbent, the search of a run before rounds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

TOP = 8
EXPLORE_BONUS = 0.5


@dataclass(frozen=True)
class Node:
    step: int
    time_us: Optional[float]  # recorded geomean time (ignored on the CPU)
    children: int = 0  # steps already derived from it, finished or proposed


def ranked(nodes: Sequence[Node], incumbent: int, cpu: bool) -> list[Node]:
    """The nodes best first (rule 2), cut to the TOP ranks; on a GPU the incumbent is first whatever its
    record, on the CPU the newest."""
    if cpu:
        return sorted(nodes, key=lambda n: -n.step)[:TOP]
    first = [n for n in nodes if n.step == incumbent]
    rest = sorted((n for n in nodes if n.step != incumbent), key=lambda n: (n.time_us is None, n.time_us or 0.0, n.step))
    return (first + rest)[:TOP]


def weight(rank: int, children: int) -> float:
    """Rule 3: rank 1 is the best."""
    return 1.0 / rank + EXPLORE_BONUS / (1 + children)


def choose_parents(nodes: Sequence[Node], incumbent: int, width: int, run_id: str, round_no: int,
                   cpu: bool) -> list[int]:
    """The parent step of each of a round's ``width`` slots, slot 0 rank 1 (on a GPU the incumbent)."""
    if width <= 0:
        return []
    order = ranked(nodes, incumbent, cpu)
    if not order or (not cpu and order[0].step != incumbent):  # the incumbent is a node whenever one passed
        order = [Node(incumbent, None)] + order[:TOP - 1]
    weights = {n.step: weight(rank, n.children) for rank, n in enumerate(order, 1)}
    rng = random.Random(f"{run_id}:{round_no}")  # str seeds hash the same in every process
    chosen = [order[0].step]
    left = [n.step for n in order[1:]]
    while len(chosen) < width and left:
        pick = rng.choices(left, weights=[weights[s] for s in left])[0]
        left.remove(pick)
        chosen.append(pick)
    steps = [n.step for n in order]
    while len(chosen) < width:
        chosen.append(rng.choices(steps, weights=[weights[s] for s in steps])[0])
    return chosen
