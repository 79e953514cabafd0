"""The planner of runs an outside agent drives: it proposes what the agent handed in, then waits.

The agent's kernels arrive all at once (one round: `optagent propose`, the MCP `propose` tool);
once they are handed out the planner raises PlannerWaiting, which stops the loop with the run
WAITING, every proposal evaluated and committed. The next round is a new process.
"""

from __future__ import annotations

from typing import Optional

from optagent.protocols import PlannerWaiting
from optagent.runs.view import PlannerContext
from optagent.schema import PlannerKind, Proposal


class ExternalPlanner:
    name = PlannerKind.EXTERNAL
    model: Optional[str] = None

    def __init__(self, proposals: Optional[list[Proposal]] = None):
        self.queue = list(proposals or [])

    def propose(self, ctx: PlannerContext) -> Proposal:
        if not self.queue:
            raise PlannerWaiting("waiting for the outside agent's next proposals")
        return self.queue.pop(0)
