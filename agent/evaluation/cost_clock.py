"""Where one evaluation's seconds went, from when the parent heard each phase start.

The candidate process's messages arrive as they are sent (the result pipe is unbuffered),
so their arrival times mark its phases: Hello ends its start-up (its own clock splits that
into the process's spawn and its imports), the lane messages bracket the timed phases, the
gate (evaluation/gates.py) says how long the lane was waited for. For display and bench/
only: no verdict rests on these figures.
"""

from __future__ import annotations

import time
from typing import Optional

from optagent.costs import Costs
from optagent.messages import Compiled, Hello, LaneReleased, LaneWanted, Message, Phase, PhaseStarted


class CostClock:
    def __init__(self, started: Optional[float] = None) -> None:
        # from the evaluation's start, as wall_s is: the parent's preparation (the native timer's build on
        # its first use in a process, the static scan, the scratch folder) counts as spawn
        self.spawned = time.monotonic() if started is None else started
        self.ended: Optional[float] = None
        self.import_s = 0.0
        self.at: dict[str, float] = {}
        self.judge_s = self.lane_wait_s = self.baseline_wait_s = 0.0
        self.timing_wait_s = self.case_wait_s = 0.0  # of lane_wait_s, the timed and checking phases' own

    def __call__(self, msg: Message) -> None:
        now = time.monotonic()
        if isinstance(msg, Hello):
            key = "hello"
            self.import_s = max(0.0, msg.import_s or 0.0)
        elif isinstance(msg, PhaseStarted) and msg.phase is Phase.COMPILING:
            key = "compiling"
        elif isinstance(msg, Compiled):
            key = "compiled"
        elif isinstance(msg, (LaneWanted, LaneReleased)):
            key = f"{msg.type}:{msg.phase.value}"
        else:
            return
        self.at.setdefault(key, now)

    def worker_ended(self) -> None:
        self.ended = time.monotonic()

    def _span(self, start: str, *ends: str) -> float:
        t0 = self.at.get(start)
        t1 = next((self.at[e] for e in ends if e in self.at), self.ended)
        return max(0.0, t1 - t0) if t0 is not None and t1 is not None else 0.0

    def costs(self) -> Costs:
        hello = self.at.get("hello")
        spawn = max(0.0, hello - self.import_s - self.spawned) if hello is not None else self._span_from_spawn()
        wanted_b, released_b = "lane_wanted:baseline", "lane_released:baseline"
        wanted_t, released_t = "lane_wanted:timing", "lane_released:timing"
        return Costs(spawn=spawn, imports=self.import_s if hello is not None else 0.0,
                     baseline=self._span(wanted_b, released_b) + self.baseline_wait_s,
                     compile=self._span("compiling", "compiled"),
                     correctness=max(0.0, self._span("compiled", wanted_t) - self.case_wait_s),
                     lane_wait=self.lane_wait_s,
                     timing=max(0.0, self._span(wanted_t, released_t) - self.timing_wait_s),
                     ending=self._span(released_t),
                     judge=self.judge_s)

    def _span_from_spawn(self) -> float:
        """A worker that never said hello: all of its time was its start."""
        return max(0.0, (self.ended or time.monotonic()) - self.spawned)
