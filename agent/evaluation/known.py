"""A pool that already holds some results: the starters timed to choose a run's language.

Choosing the language evaluates every starter (cli/language.py); the chosen one's result then
becomes the run's step 0 instead of a second evaluation of the same source (50 s of an 8-minute
budget on the H200 for a small kernel). Each known result is handed out once, for a job of the
same source and language; everything else goes to the pool behind it.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from optagent.progress import ProgressSink
from optagent.protocols import Pool, PoolJob
from optagent.schema import EvalResult, Language


class KnownFirst:
    def __init__(self, pool: Pool, known: dict[tuple[str, Language], EvalResult], timed_on: Optional[str] = None):
        """timed_on: the pool's lane that stands for the process that timed the known results (the first
        visible GPU is local lane 0's), so that acceptance compares them as one lane's timings."""
        self.pool, self.lanes = pool, pool.lanes
        self.known = {k: r.model_copy(update={"timed_on": timed_on}) if timed_on else r for k, r in known.items()}

    def evaluate(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None
                 ) -> Iterator[tuple[PoolJob, EvalResult]]:
        rest = []
        for job in jobs:
            found = self.known.pop((job.source, job.language), None)
            if found is not None:
                yield job, found
            else:
                rest.append(job)
        if rest:
            yield from self.pool.evaluate(rest, progress)

    def retime(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None) -> list[EvalResult]:
        return self.pool.retime(jobs, progress)

    def close(self) -> None:
        self.pool.close()
