"""The cost split of one evaluation: where its seconds went (filled in by evaluation/cost_clock.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Costs(BaseModel):
    """Seconds of one evaluation, part by part; about its wall_s in all."""

    model_config = ConfigDict(extra="forbid")

    spawn: float = 0.0  # the parent's preparation and the worker process up to its harness's first line
    imports: float = 0.0  # torch and the task package, in the candidate process
    baseline: float = 0.0  # timing the baselines in the candidate process, or waiting for its lane's
    compile: float = 0.0
    correctness: float = 0.0  # running and checking the kernel on every case
    lane_wait: float = 0.0  # waiting for the timing lane (a GPU another evaluation times on)
    timing: float = 0.0
    ending: float = 0.0  # the candidate's process from its timed phase's end to its end (its last messages, its exit)
    judge: float = 0.0
    profile: float = 0.0  # --profile: the kernel run again under ncu (evaluation/profiler.py)

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in type(self).model_fields)
