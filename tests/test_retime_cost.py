"""A re-time is timing only, and no candidate's process leaves anything to the next one (real worker
processes on the CPU, the decode package's first smoke case)."""

from __future__ import annotations

import pytest

from optagent.evaluation import evaluator as evaluator_module
from optagent.evaluation import judges as judges_module
from optagent.evaluation import referee as referee_module
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation.pool import LocalPool
from optagent.messages import CaseRan
from optagent.protocols import PoolJob
from optagent.schema import Language, Status
from optagent.task import load_task

RUN_KERNEL = "def run_kernel(\n"


def with_body(starter: str, prologue: str) -> str:
    head, sep, rest = starter.partition(RUN_KERNEL)
    signature, colon, body = rest.partition("):\n")
    return head + sep + signature + colon + prologue + body


@pytest.fixture
def pool_and_modes(task_dir, monkeypatch):
    """A local pool (one lane) over the sandboxed evaluator, and the mode of every worker process it starts."""
    task = load_task(task_dir)
    modes: list[str] = []
    real = evaluator_module.run_worker

    def counted(job, *args, **kwargs):
        modes.append(job.mode)
        return real(job, *args, **kwargs)
    monkeypatch.setattr(evaluator_module, "run_worker", counted)
    monkeypatch.setattr(judges_module, "run_worker", counted)  # a judge started cold (evaluation/judges.py)

    class Warm(judges_module.WarmWorker):  # a judge started beside its candidate (evaluation/judges.py)
        def __init__(self, template, *args, **kwargs):
            modes.append("warm " + template.mode)
            super().__init__(template, *args, **kwargs)

        def run(self, job, *args, **kwargs):
            modes.append(job.mode)
            return super().run(job, *args, **kwargs)
    monkeypatch.setattr(judges_module, "WarmWorker", Warm)
    # the scan off in the state test: its kernel reaches for process state the scan would refuse
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=150,
                          static_scan=False)
    pool = LocalPool(ev, jobs=2, devices=[None])
    yield task, pool, modes
    pool.close()


def test_a_retime_runs_no_judge_and_no_checked_run(pool_and_modes, monkeypatch):
    task, pool, modes = pool_and_modes
    source = task.starter(Language.TRITON).source
    samples: list[int] = []  # saved outputs per candidate process, as the parent reads its messages
    assemble = evaluator_module.assemble

    def spy(job, run, *a, **k):
        samples.append(sum(len(m.samples) for m in run.all(CaseRan)))
        return assemble(job, run, *a, **k)
    monkeypatch.setattr(evaluator_module, "assemble", spy)
    heard: list[str] = []  # the kinds of question the referees heard (the native clock answers T and D itself)
    answer = referee_module.Referee._answer

    def listen(self, raw, window_us, told=None):  # told: the clock's own answer to an R (it is filed all the same)
        heard.append(raw[:1].decode())
        return answer(self, raw, window_us, told)
    monkeypatch.setattr(referee_module.Referee, "_answer", listen)
    [(_, first)] = list(pool.evaluate([PoolJob(0, source, Language.TRITON)]))
    evaluation_asked = heard.count("R")
    heard.clear()
    assert first.status is Status.PASSED and modes.count("judge") == 1
    assert first.costs.judge > 0 and first.cases[0].rel_err is not None
    modes.clear()
    again = pool.retime([PoolJob(0, source, Language.TRITON), PoolJob(1, source, Language.TRITON)])
    assert [r.status for r in again] == [Status.PASSED, Status.PASSED], [r.reason for r in again]
    # two candidate processes and no judge (the lane's baseline job may run again: the host drifted)
    assert modes.count("candidate") == 2 and "judge" not in modes and "warm judge" not in modes, modes
    assert all(r.costs.judge == 0 and r.cases[0].time_us for r in again)
    # timing only: the first evaluation saved its checked runs and timed calls, the re-time's processes nothing
    assert samples[0] >= 2 and samples[1:] == [0, 0], samples
    # but its loops do the evaluation's work between calls (digest told, inputs redrawn): less work there makes the
    # next call read faster by itself (docs/gpu.md, 2026-12-07), and a re-time is held to the judged figure
    assert evaluation_asked > 0 and heard.count("R") >= evaluation_asked, (evaluation_asked, heard)  # two kernels


def test_no_state_is_carried_from_one_candidates_process_to_the_next(pool_and_modes):
    """The first candidate leaves what it can in its process (a thread count, a mark on torch, a module of its
    own in sys.modules); the second fails if it finds any of it. Each candidate gets a fresh process."""
    task, pool, modes = pool_and_modes
    starter = task.starter(Language.TRITON).source
    leaves = with_body(starter, "    import sys, types\n    torch.set_num_threads(97)\n"
                                "    torch.optagent_left_by_a = 1\n"
                                "    sys.modules['optagent_left_by_a'] = types.ModuleType('optagent_left_by_a')\n")
    finds = with_body(starter, "    import sys\n"
                               "    if torch.get_num_threads() == 97 or hasattr(torch, 'optagent_left_by_a') \\\n"
                               "            or 'optagent_left_by_a' in sys.modules:\n"
                               "        raise RuntimeError('state left by an earlier candidate')\n")
    assert "import sys" in leaves and "state left" in finds
    [(_, a)] = list(pool.evaluate([PoolJob(0, leaves, Language.TRITON)]))
    [(_, b)] = list(pool.evaluate([PoolJob(1, finds, Language.TRITON)]))
    assert a.status is not Status.COMPILE_ERROR, a.reason  # it ran, whatever its verdict
    assert b.status is Status.PASSED, b.reason
    # and the check can fail: the same kernel finds the state when it is left in its own process
    both = with_body(starter, "    import sys\n    if getattr(run_kernel, 'seen', False) and not hasattr(torch, "
                              "'optagent_left_by_a'):\n        raise RuntimeError('no mark in its own process')\n"
                              "    run_kernel.seen = True\n    torch.optagent_left_by_a = 1\n")
    [(_, c)] = list(pool.evaluate([PoolJob(2, both, Language.TRITON)]))
    assert c.status is not Status.RUNTIME_ERROR or "no mark" not in (c.reason or ""), c.reason
