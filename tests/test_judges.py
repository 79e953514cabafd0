"""A candidate's cases judged by two judges side by side (evaluation/judges.py): how the cases are split, how
the two answers are read as one, and, under bubblewrap (where judges start beside their candidate: on a GPU;
here, on the CPU, they are asked for), that every case gets its verdict from one of them."""

from __future__ import annotations

import pytest

from optagent.evaluation import isolation, judges, warm_worker
from optagent.evaluation.cases import select_cases
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.sandbox import WorkerRun
from optagent.messages import CaseSpec, Done, Job, Sample, Verdict
from optagent.schema import CaseKind, Language, Mechanism, Status
from optagent.task import load_task

bwrap_only = pytest.mark.skipif(isolation.mechanism() is not Mechanism.BWRAP,
                                reason="judges start beside their candidate only under bubblewrap")


def _job(counts: dict[str, int]) -> Job:
    cases = [CaseSpec(label=k, kind=CaseKind.HIDDEN) for k in counts]
    samples = {k: [Sample(name=f"s{i}", base_seed=i, refresh_seed=None, file=f"{k}-{i}.pt", sha256="0" * 64)
                   for i in range(n)] for k, n in counts.items()}
    return Job(mode="judge", task_dir="/nowhere", device="cpu", cases=cases, seed=1, nonce="n", scratch="/nowhere",
               samples=samples)


def test_cases_are_split_by_their_samples_and_keep_their_order():
    job = _job({"a": 10, "b": 1, "c": 1, "d": 1, "e": 7, "f": 2})
    groups = judges.split_cases(job, 2)
    labels = [[c.label for c in g] for g in groups]
    assert len(groups) == 2 and all(labels)
    assert sorted(sum(labels, [])) == sorted("abcdef")  # every case once
    order = "abcdef"
    assert all(g == sorted(g, key=order.index) for g in labels)  # each in the job's order
    weight = [sum(len(job.samples[k]) for k in g) for g in labels]
    assert abs(weight[0] - weight[1]) <= 2, weight  # 10 + 2 against 7 + 1 + 1 + 1
    assert [[c.label for c in g] for g in judges.split_cases(_job({"x": 3}), 2)] == [["x"]]  # nothing to split
    part = judges.part(job, groups[1])
    assert set(part.samples) == set(labels[1]) and [c.label for c in part.cases] == labels[1]


def test_two_answers_read_as_one_keep_every_verdict_and_the_failure():
    ok = WorkerRun(messages=[Verdict(case="a", status=Status.PASSED), Done()], wall_s=2.0)
    cut = WorkerRun(messages=[Verdict(case="b", status=Status.PASSED)], limit="over the time limit", returncode=-9,
                    wall_s=3.0, stderr_tail="killed")
    both = judges.merged([ok, cut])
    assert [m.case for m in both.messages if isinstance(m, Verdict)] == ["a", "b"]
    assert both.limit == "over the time limit" and both.returncode == -9 and both.wall_s == 3.0
    assert judges.merged([ok, ok]).limit is None


# Wrong on one case only (hidden-1 is the only case with three sequences): its verdict must come from whichever
# judge had it.
WRONG_ON_ONE = """

_right = run_kernel


def run_kernel(*args):
    _right(*args)
    if args[0].shape[0] == 3:
        args[3].mul_(1.5)
"""


class JudgeJobs:
    """The jobs the warm judges were handed, and (optionally) one judge killed while it waits."""

    def __init__(self, monkeypatch, kill_second: bool = False):
        monkeypatch.setattr(warm_worker, "available", lambda device: True)
        self.jobs: list[list[str]] = []
        real_run, rec = warm_worker.WarmWorker.run, self

        def run(self, job, *a, **k):
            if job.mode == "judge":
                rec.jobs.append([c.label for c in job.cases])
            return real_run(self, job, *a, **k)
        monkeypatch.setattr(warm_worker.WarmWorker, "run", run)
        if kill_second:
            real_judges_run = judges.Judges.run

            def judges_run(self, job, on_message):
                if len(self.workers) > 1:
                    self.workers[1].spawned.proc.kill()
                    self.workers[1].spawned.proc.wait(timeout=30)
                return real_judges_run(self, job, on_message)
            monkeypatch.setattr(judges.Judges, "run", judges_run)


def _evaluator(task_dir) -> tuple[SandboxEvaluator, list[str], str]:
    task = load_task(task_dir)
    cases = select_cases(task, "cpu", 0, None, hidden=True)[:5]
    ev = SandboxEvaluator(task, "cpu", cases, timeout_s=180, static_scan=False)
    return ev, [c.label for c in cases], task.starter(Language.TRITON).source


@bwrap_only
def test_the_first_judge_runs_alone_then_two_split_the_cases(task_dir, monkeypatch):
    rec = JudgeJobs(monkeypatch)
    ev, labels, source = _evaluator(task_dir)
    assert "hidden-1" in labels
    first = ev.evaluate(source, Language.TRITON)
    assert first.status is Status.PASSED, first.reason
    assert rec.jobs == [labels]  # alone: it measures and caches what judges read (judges.py)
    rec.jobs.clear()
    wrong = ev.evaluate(source + WRONG_ON_ONE, Language.TRITON)
    assert len(rec.jobs) == 2 and all(rec.jobs), rec.jobs
    assert sorted(rec.jobs[0] + rec.jobs[1]) == sorted(labels)  # each case judged once, by one of the two
    assert wrong.status is Status.INCORRECT, wrong.reason
    by_case = {c.case: c for c in wrong.cases}
    assert by_case["hidden-1"].status is Status.INCORRECT, by_case["hidden-1"].reason
    assert all(c.status is Status.PASSED and c.rel_err is not None for k, c in by_case.items() if k != "hidden-1")


@bwrap_only
def test_a_judge_that_died_while_it_waited_is_replaced(task_dir, monkeypatch):
    rec = JudgeJobs(monkeypatch, kill_second=True)
    ev, labels, source = _evaluator(task_dir)
    ev._judged = True  # as after a first evaluation: two judges start beside the candidate
    result = ev.evaluate(source, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    assert rec.jobs == [labels]  # the one alive judged all (the dead one was never handed a job)
    assert all(c.status is Status.PASSED and c.rel_err is not None for c in result.cases)



def test_a_pool_splits_the_judging_only_of_an_evaluation_alone_on_its_lane():
    from test_pool_memory import CrowdedGpu  # noqa: E402  (tests/ is on sys.path under pytest)
    from optagent.evaluation.pool import LocalPool
    from optagent.protocols import PoolJob

    gpu = CrowdedGpu()  # each evaluation takes 0.3 s
    pool = LocalPool(gpu, jobs=2, devices=[None])
    try:
        list(pool.evaluate([PoolJob(0, "alone", Language.TRITON)]))
        list(pool.evaluate([PoolJob(1, "first", Language.TRITON), PoolJob(2, "beside", Language.TRITON)]))
    finally:
        pool.close()
    assert gpu.judges["alone"] is None  # the evaluator's own number (two, after its first judge)
    # the one that started second started beside the other: one judge; the other was alone as it started
    assert sorted([gpu.judges["first"], gpu.judges["beside"]], key=str) == [1, None]
