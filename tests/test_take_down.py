"""A worker taken down (evaluation/take_down.py): a judge's answer counts at its Done, its exit is waited for in the
background; any other worker is read to its end."""

from __future__ import annotations

import time

from optagent.evaluation import sandbox, take_down
from optagent.evaluation.cost_clock import CostClock
from optagent.evaluation.scratch import new_scratch, remove_scratch
from optagent.messages import Done, Job, LaneReleased, Phase
from optagent.schema import Device

# The worker, then a shell that lingers after it with the result pipe still open, as a GPU process's exit does
# while its context is torn down.
LINGER_S = 6.0
LINGERING = ["/bin/sh", "-c", f'"$@"; sleep {LINGER_S:g}', "sh"]


def _spawned(monkeypatch) -> list:
    seen: list = []
    real = sandbox.spawn

    def spawn(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]
    monkeypatch.setattr(sandbox, "spawn", spawn)
    return seen


def _run(task_dir, tmp_path, mode: str) -> tuple[sandbox.WorkerRun, float]:
    scratch, nonce = new_scratch(tmp_path)
    try:
        job = Job(mode=mode, task_dir=str(task_dir), device=Device.CPU, cases=[], seed=1, nonce=nonce,
                  scratch=str(scratch))
        t0 = time.monotonic()
        run = sandbox.run_worker(job, 120, prefix=LINGERING)
        return run, time.monotonic() - t0
    finally:
        remove_scratch(scratch)


def test_a_judges_answer_counts_at_its_done_and_its_exit_is_waited_for_behind(task_dir, tmp_path, monkeypatch):
    seen = _spawned(monkeypatch)
    run, took = _run(task_dir, tmp_path, "judge")
    assert run.first(Done) is not None and run.returncode == 0, run.stderr_tail
    assert took < LINGER_S  # not read to its end: the shell still lingers
    assert seen[0].proc.poll() is None  # and is still there, being taken down in the background
    take_down.reaped()
    assert seen[0].proc.poll() is not None  # gone once reaped() returns (a pool's close waits for it)


def test_any_other_worker_is_read_to_its_end(task_dir, tmp_path, monkeypatch):
    """The contrast: a package probe (and a candidate) is trusted to have ended only once its pipe closes."""
    seen = _spawned(monkeypatch)
    run, took = _run(task_dir, tmp_path, "probe")
    assert run.first(Done) is not None, run.stderr_tail
    assert took >= LINGER_S
    assert seen[0].proc.poll() is not None


def test_the_cost_split_counts_a_candidates_ending_apart_from_its_timing():
    clock = CostClock(started=0.0)
    clock(LaneReleased(phase=Phase.TIMING))
    time.sleep(0.05)
    clock.worker_ended()
    costs = clock.costs()
    assert costs.ending >= 0.05 and costs.timing == 0.0
