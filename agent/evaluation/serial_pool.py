"""The simplest Pool: one evaluator, one job at a time, in order. One lane, so every timing is on one device."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from optagent.progress import ProgressSink, stamped
from optagent.protocols import Evaluator, PoolJob
from optagent.schema import EvalResult


class SerialPool:
    lanes = 1

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator

    def _one(self, job: PoolJob, progress: Optional[ProgressSink]) -> EvalResult:
        return self.evaluator.evaluate(job.source, job.language, progress=stamped(progress, step=job.key))

    def evaluate(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None
                 ) -> Iterator[tuple[PoolJob, EvalResult]]:
        for job in jobs:
            yield job, self._one(job, progress)

    def retime(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None) -> list[EvalResult]:
        return [self._one(job, progress) for job in jobs]
