"""The starters timed to choose a run's language: the chosen one's result is the run's step 0,
not a second evaluation (evaluation/known.py, cli/language.py)."""

from __future__ import annotations

from pathlib import Path

from optagent.cli.language import pick_language
from optagent.evaluation.known import KnownFirst
from optagent.protocols import PoolJob
from optagent.schema import CaseKind, CaseResult, Device, EvalResult, Language, Status
from optagent.task import load_task

PKG = Path(__file__).parent / "fixtures" / "packages" / "softmax"


def _result(us: float) -> EvalResult:
    case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time_us=us, baseline_us=2 * us)
    return EvalResult(status=Status.PASSED, language=Language.TRITON, device=Device.CUDA, source_sha256="x",
                      cases=[case], wall_s=1.0)


class CountingEvaluator:
    def __init__(self, times: dict[Language, float]):
        self.times, self.calls = times, []

    def evaluate(self, source: str, language: Language, progress=None) -> EvalResult:
        self.calls.append(language)
        return _result(self.times[language]).model_copy(update={"language": language})


class RecordingPool:
    lanes = 1

    def __init__(self):
        self.seen: list[int] = []

    def evaluate(self, jobs, progress=None):
        for job in jobs:
            self.seen.append(job.key)
            yield job, _result(99.0)

    def retime(self, jobs, progress=None):
        self.seen += [j.key for j in jobs]
        return [_result(98.0) for _ in jobs]


def test_the_chosen_starters_result_is_handed_out_once():
    pool = RecordingPool()
    known = {("src0", Language.TRITON): _result(5.0)}
    wrapped = KnownFirst(pool, known)
    jobs = [PoolJob(0, "src0", Language.TRITON), PoolJob(1, "src1", Language.TRITON),
            PoolJob(2, "src0", Language.CUDA)]
    got = {job.key: round(r.geomean_time_us, 6) for job, r in wrapped.evaluate(jobs)}
    assert got == {0: 5.0, 1: 99.0, 2: 99.0} and pool.seen == [1, 2]
    again = dict((job.key, round(r.geomean_time_us, 6)) for job, r in wrapped.evaluate([PoolJob(3, "src0", Language.TRITON)]))
    assert again == {3: 99.0}, "a known result is used once: a second proposal of the same source is evaluated"
    assert round(wrapped.retime([PoolJob(4, "src0", Language.TRITON)])[0].geomean_time_us, 6) == 98.0 and wrapped.lanes == 1


def test_known_results_are_stamped_as_the_lane_that_stands_for_their_process():
    """build_pool stamps them as local lane 0's, so a clear gain over the starter needs no re-time."""
    from optagent.app.build import build_pool
    from optagent.evaluation.evaluator import SandboxEvaluator

    task = load_task(PKG)
    ev = SandboxEvaluator(task, "cpu", [], timeout_s=60)
    pool = build_pool(ev, known={("src0", Language.TRITON): _result(5.0)})
    try:
        [(_, r)] = list(pool.evaluate([PoolJob(0, "src0", Language.TRITON)]))
        assert r.timed_on == pool.pool.lane_list[0].name == "lane 0"
    finally:
        pool.close()


def test_pick_language_returns_the_starters_it_timed():
    task = load_task(PKG)
    ev = CountingEvaluator({Language.TRITON: 120.0, Language.CUDA: 270.0})
    lang, why, results = pick_language(task, Device.CUDA, None, lambda: ev, lambda line: None)
    assert lang is Language.TRITON and "fastest starter" in why
    assert set(results) == {Language.TRITON, Language.CUDA} and round(results[lang].geomean_time_us, 6) == 120.0
    assert sorted(ev.calls, key=str) == sorted([Language.TRITON, Language.CUDA], key=str)
    lang, why, results = pick_language(task, Device.CUDA, "cuda", lambda: ev, lambda line: None)
    assert (lang, why, results) == (Language.CUDA, "chosen with --language", {})
