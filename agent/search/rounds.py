"""A round's proposals: each slot's parent (parents.py), its planner context, and the planner asked once.

A planner with ``propose_round`` (protocols.RoundPlanner) gets the round's contexts together; any other
is asked slot by slot with ``propose``, each slot's exception kept as that slot's outcome.
"""

from __future__ import annotations

from typing import Optional

from optagent.ranking import timings_rank
from optagent.protocols import Planner, PlannerExhausted, RoundPlanner, SlotOutcome
from optagent.runs.view import PlannerContext
from optagent.schema import RunConfig
from optagent.search.parents import Node, choose_parents
from optagent.runs.trajectory import Trajectory

def nodes(traj: Trajectory) -> list[Node]:
    """The passing kernels, with how many steps (finished or proposed) were derived from each."""
    kids: dict[int, int] = dict(traj.children)
    for _, proposal in traj.unfinished:
        if proposal.parent is not None:
            kids[proposal.parent] = kids.get(proposal.parent, 0) + 1
    return [Node(s.index, s.result.geomean_time_us, kids.get(s.index, 0)) for s in traj.steps
            if s.outcome.is_node and s.result is not None and s.result.status.ok]


def round_parents(traj: Trajectory, config: RunConfig, width: int) -> list[Optional[int]]:
    """Each slot's parent step; None (the starter's source) while no kernel has passed."""
    best = traj.best.step if traj.best else None
    if best is None:
        return [None] * width
    return list(choose_parents(nodes(traj), best, width, config.run_id, traj.next_round,
                               cpu=not timings_rank(config.device, [traj.best.result])))


def propose_all(planner: Planner, ctxs: list[PlannerContext]) -> list[SlotOutcome]:
    if isinstance(planner, RoundPlanner):
        outcomes = list(planner.propose_round(ctxs))
        if len(outcomes) != len(ctxs):
            raise RuntimeError(f"the planner answered {len(outcomes)} of {len(ctxs)} slots")
        return outcomes
    out: list[SlotOutcome] = []
    for ctx in ctxs:
        try:
            out.append(planner.propose(ctx))
        except PlannerExhausted as e:  # the later slots would find nothing either
            out += [e] * (len(ctxs) - len(out))
            break
        except Exception as e:  # an endpoint that fails is that slot's outcome, recorded as a step
            out.append(e)
    return out


def affordable(budget_usd: Optional[float], spent_usd: float, steps: int) -> int:
    """How many proposals the budget still pays for at the run's cost per step so far. A round's
    requests go out at once, so without this cut a round overshoots --budget-usd by up to K-1 steps."""
    if budget_usd is None or spent_usd <= 0 or steps <= 0:
        return 1 << 30  # nothing known yet: the round as wide as asked
    return max(1, int((budget_usd - spent_usd) / (spent_usd / steps) + 1e-9))  # 0.8 / 0.4 is 1.99..
