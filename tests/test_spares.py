"""Candidate processes started before their candidates (evaluation/warm_worker.py Spares): a pool keeps them, a
candidate runs in one, and nothing of one candidate reaches the next. Spares are a GPU's under bubblewrap
(warm_worker.available); here, on the CPU, they are asked for."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from optagent.evaluation import isolation, warm_worker
from optagent.evaluation.cases import select_cases
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.pool import LocalPool
from optagent.protocols import PoolJob
from optagent.schema import Language, Mechanism, Status
from optagent.task import load_task

pytestmark = pytest.mark.skipif(isolation.mechanism() is not Mechanism.BWRAP,
                                reason="spares are started only under bubblewrap")

# What a candidate could leave for the next one in a process, a file system or another process it can reach.
PLANT = '''
import builtins as _b, os as _os, pathlib as _p, signal as _sig
import torch as _torch
_torch._optagent_plant = 1
_b._optagent_plant = 1
_os.environ["OPTAGENT_PLANT"] = "1"
for _d in ("/tmp", "/dev/shm", _os.path.dirname(_os.getcwd()), _os.environ.get("TRITON_CACHE_DIR", "/tmp")):
    try:
        _p.Path(_d).mkdir(parents=True, exist_ok=True)
        _p.Path(_d, "optagent_plant").write_text("1")
    except OSError:
        pass
_mine, _pid = set(), _os.getpid()
while _pid > 1:  # itself and its ancestors (its sandbox) are spared
    _mine.add(_pid)
    _pid = int(_p.Path(f"/proc/{_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
for _q in _os.listdir("/proc"):  # every other harness process it can see: killed
    try:
        if _q.isdigit() and int(_q) not in _mine and b"optagent" in _p.Path(f"/proc/{_q}/cmdline").read_bytes():
            _os.kill(int(_q), _sig.SIGKILL)
    except OSError:
        pass
'''

LOOK = '''
import builtins as _b, os as _os, pathlib as _p
import torch as _torch
_found = [w for w, hit in [
    ("torch", hasattr(_torch, "_optagent_plant")), ("builtins", hasattr(_b, "_optagent_plant")),
    ("environ", "OPTAGENT_PLANT" in _os.environ),
    *[(d, _p.Path(d, "optagent_plant").exists()) for d in
      ("/tmp", "/dev/shm", _os.path.dirname(_os.getcwd()), _os.environ.get("TRITON_CACHE_DIR", "/tmp"))]] if hit]
if _found:
    raise RuntimeError(f"the last candidate's state is here: {_found}")
'''


class Watched:
    """The spares a pool keeps, watched: when each was started, and which ones ran a candidate."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(warm_worker, "available", lambda device: True)
        self.ran: list[tuple[float, bool]] = []  # (when the spare was started, whether it was alive at its job)
        real_run = warm_worker.WarmWorker.run
        rec = self

        self.judged: list[tuple[float, float, object]] = []  # (a judge's start, when handed its job, the judge)

        def run(self, job, *a, **k):
            if job.mode == "candidate":
                rec.ran.append((self.spawned.start, self.spawned.proc.poll() is None))
            else:
                rec.judged.append((self.spawned.start, time.monotonic(), self))
            return real_run(self, job, *a, **k)
        monkeypatch.setattr(warm_worker.WarmWorker, "run", run)


def _every_warm_worker(monkeypatch) -> list[warm_worker.WarmWorker]:
    """Every warm worker started from now on (spares and their judges), in the order started."""
    made: list[warm_worker.WarmWorker] = []
    real_init = warm_worker.WarmWorker.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(warm_worker.WarmWorker, "__init__", init)
    return made


def _pool(task_dir: Path) -> tuple[LocalPool, str]:
    task = load_task(task_dir)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120,
                          static_scan=False, guard=False)  # the operating system's containment alone
    return LocalPool(ev, jobs=1, devices=[None]), task.starter(Language.TRITON).source


def _ready(pool: LocalPool, n: int, wait_s: float = 60.0, ask: bool = True) -> None:
    """n spares started, as a run has them by its second candidate (spares start once a candidate's process has
    ended: here they are asked for at once)."""
    spares = pool.evaluator.spares
    assert spares is not None
    if ask:
        spares.top_up(None)
    deadline = time.monotonic() + wait_s
    while spares.started < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert spares.started >= n, "the pool's spare was never started"


def test_a_candidate_runs_in_a_spare_and_leaves_nothing_for_the_next(task_dir, monkeypatch):
    rec = Watched(monkeypatch)
    pool, source = _pool(task_dir)
    try:
        _ready(pool, 2)  # a spare for each of the two candidates, both waiting before the first one runs
        (_, first), = pool.evaluate([PoolJob(1, PLANT + source, Language.TRITON)])
        ended = time.monotonic()
        assert first.status is Status.PASSED, first.reason  # its plants did not stop it
        (_, second), = pool.evaluate([PoolJob(2, LOOK + source, Language.TRITON)])
        assert second.status is Status.PASSED, second.reason  # none of the plants is in its process or files
        assert len(rec.ran) == 2 and all(alive for _, alive in rec.ran)  # each in a spare, the second not killed
        assert rec.ran[1][0] < ended  # which was waiting beside the planting candidate
        # both were judged by the pool's judges, one of them both times (PLANT killed every process it could see)
        assert len(rec.judged) == 2 and rec.judged[0][2] is rec.judged[1][2]
        assert pool.evaluator.spares.taken == 2
        _ready(pool, 3, ask=False)  # and a third, started by the pool once the first candidate's process ended
    finally:
        pool.close()


def test_a_planted_state_would_be_found(task_dir):
    """The check above can fail: in one process, the plants are seen."""
    task = load_task(task_dir)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120,
                          static_scan=False, guard=False)
    result = ev.evaluate(PLANT + LOOK + task.starter(Language.TRITON).source, Language.TRITON)
    assert result.status is Status.COMPILE_ERROR and "the last candidate's state is here" in (result.reason or "")


def test_a_closed_pool_takes_its_spares_down(task_dir, monkeypatch):
    Watched(monkeypatch)
    pool, _ = _pool(task_dir)
    _ready(pool, 1)
    spares, judges = pool.evaluator.spares, pool.evaluator.judges
    waiting = [w for ready in spares._ready.values() for w in ready] + list(judges._all)
    assert len(waiting) >= 3 and all(w.spawned.proc.poll() is None and w.scratch.is_dir() for w in waiting)
    pool.close()
    assert pool.evaluator.spares is None and pool.evaluator.judges is None
    for w in waiting:  # the spares and the judges that serve the pool's evaluations, with their scratch
        assert w.spawned.proc.poll() is not None and not w.scratch.exists()


def test_a_spare_that_died_while_it_waited_is_replaced_by_a_fresh_process(task_dir, monkeypatch):
    import os

    rec = Watched(monkeypatch)
    pool, source = _pool(task_dir)
    try:
        _ready(pool, 2)  # both the pool keeps
        for ready in pool.evaluator.spares._ready.values():  # a fault: the waiting spares are killed
            for w in ready:
                os.killpg(w.spawned.proc.pid, 9)
                w.spawned.proc.wait()
        (_, result), = pool.evaluate([PoolJob(1, source, Language.TRITON)])
        assert result.status is Status.PASSED, result.reason
        assert rec.ran == []  # no spare was handed a job: a process was started for it
    finally:
        pool.close()


def test_none_are_kept_when_the_setting_says_none(task_dir, monkeypatch):
    Watched(monkeypatch)
    monkeypatch.setenv("OPTAGENT_SPARES", "0")
    pool, _ = _pool(task_dir)
    try:
        assert pool.evaluator.spares is None
    finally:
        pool.close()
    monkeypatch.setenv("OPTAGENT_SPARES", "-1")
    from optagent.settings import EnvError

    with pytest.raises(EnvError, match="OPTAGENT_SPARES"):
        _pool(task_dir)


def test_a_pool_stopped_mid_evaluation_leaves_no_process_or_scratch_behind(task_dir, monkeypatch):
    """Fault injection: the run stops (its time limit, Ctrl-C) while a candidate hangs in a spare and others wait."""
    import threading

    Watched(monkeypatch)
    made = _every_warm_worker(monkeypatch)
    pool, source = _pool(task_dir)
    hang = source.replace("def run_kernel(", "def run_kernel(*_a, **_k):\n    while True:\n        pass\n\n\ndef _unused(", 1)
    stop = threading.Event()
    try:
        _ready(pool, 2)
        threading.Timer(3.0, stop.set).start()
        t0 = time.monotonic()
        results = list(pool.evaluate([PoolJob(1, hang, Language.TRITON)], stop=stop))
        assert time.monotonic() - t0 < 30  # stopped, not run to its timeout
        assert all(r.status is not Status.PASSED for _, r in results)
    except Exception as e:  # a stopped pool may say so by raising: what it leaves behind is the point
        assert stop.is_set(), e
    finally:
        pool.close()
    assert len(made) >= 2
    for w in made:
        assert w.spawned.proc.poll() is not None, "a spare outlived its pool"
        assert not w.scratch.exists(), f"{w.scratch} outlived its pool"


def test_spares_start_with_the_pool_and_the_first_evaluation_runs_in_one(task_dir, monkeypatch):
    """A run's first evaluation (its starter) is a candidate like the others: its process was started with the pool,
    and, where the lane waits for start-ups (OPTAGENT_SETTLE_S), its timed phase waited for every process started
    for its lane."""
    monkeypatch.setenv("OPTAGENT_SETTLE_S", "10")
    rec = Watched(monkeypatch)
    made = _every_warm_worker(monkeypatch)
    pool, source = _pool(task_dir)
    try:
        _ready(pool, 1, ask=False)  # started by the pool itself, before any evaluation
        (_, first), = pool.evaluate([PoolJob(1, source, Language.TRITON)])
        assert first.status is Status.PASSED, first.reason
        assert len(rec.ran) == 1 and rec.ran[0][1]  # in a spare, which was alive when its job came
        timed = pool.lane_list[0].holds[-1]
        started = [w for w in made if w.spawned.start < timed.granted]
        assert all(w.warm_at is not None and w.warm_at <= timed.granted for w in started)
    finally:
        pool.close()


def test_a_timed_phase_waits_for_the_processes_still_starting_for_its_lane(task_dir, monkeypatch):
    """A spare's start-up (torch imported, a GPU context made) beside a timed phase slows the timing: on the H200 a
    re-time's second process, still importing beside the first kernel's timing, made 20 of its 32 loops run again
    after a slow host. A lane is granted only once every process started for it (spares, taken or not, and their
    judges) has said its start-up is over (warm_worker.Spares.settle, lanes.Lane.acquire)."""
    monkeypatch.setenv("OPTAGENT_SETTLE_S", "10")  # the wait is off by default (settings.py says why)
    Watched(monkeypatch)
    made = _every_warm_worker(monkeypatch)
    pool, source = _pool(task_dir)
    try:
        _ready(pool, 2)  # two spares and their judges spawned just now: importing torch still
        started = time.monotonic()
        (_, result), = pool.evaluate([PoolJob(1, source, Language.TRITON)])
        assert result.status is Status.PASSED, result.reason
        holds = pool.lane_list[0].holds  # the baseline job's timed phase, then the candidate's
        assert len(holds) == 2
        before = [w for w in made if w.spawned.start < started]
        assert len(before) >= 4, len(before)  # two spares and the pool's two judges
        for hold in holds:
            assert all(w.warm_at is not None and w.warm_at <= hold.granted for w in before), \
                [(w.spawned.job.mode, w.warm_at, hold.granted) for w in before]
        # the first grant waited for them: the baseline job's process is cold, but not as slow as three at once
        assert holds[0].granted - started > 0.5
    finally:
        pool.close()


def test_a_warm_worker_says_when_its_start_up_is_over(task_dir, monkeypatch):
    """The WARM byte comes once warm_up() is over, with the process still waiting for its job; warm() hears it,
    and settle() then has nothing to wait for."""
    Watched(monkeypatch)
    pool, _ = _pool(task_dir)
    try:
        spares = pool.evaluator.spares
        _ready(pool, 1)
        worker = spares._ready[None][0]
        assert not worker.warm(0)  # python, torch and the harness take longer than this to import
        assert worker.warm(60) and worker.warm_at is not None
        assert worker.spawned.proc.poll() is None  # warm, and waiting for its job: the byte was not its end
        spares.settle(None, 60)
        assert spares.settle(None, 60) < 0.5  # every process started for the lane is warm now
        assert all(w.warm(0) for ready in spares._ready.values() for w in ready)
    finally:
        pool.close()


def test_a_serving_judge_that_died_is_replaced_and_the_next_evaluation_judged(task_dir, monkeypatch):
    """Fault injection: the pool's judges serve one evaluation after another (judges.py JudgeService); one killed
    between two evaluations is taken down and another started in its place; the next evaluation, finding none
    alive, still gets its verdict (from a judge started for it), and the one after from a judge of the pool."""
    import os

    rec = Watched(monkeypatch)
    pool, source = _pool(task_dir)
    try:
        _ready(pool, 2)
        (_, first), = pool.evaluate([PoolJob(1, source, Language.TRITON)])
        assert first.status is Status.PASSED, first.reason
        service = pool.evaluator.judges
        before = list(service._all)
        for w in before:  # every judge of the pool, killed while it waits for its next job
            os.killpg(w.spawned.proc.pid, 9)
            w.spawned.proc.wait()
        (_, second), = pool.evaluate([PoolJob(2, source + "\n# again\n", Language.TRITON)])
        assert second.status is Status.PASSED, second.reason
        assert all(w not in service._all for w in before) and len(service._all) == len(before)  # replaced
        (_, third), = pool.evaluate([PoolJob(3, source + "\n# and again\n", Language.TRITON)])
        assert third.status is Status.PASSED, third.reason
        assert rec.judged[-1][2] in service._all  # one of those started in their place
    finally:
        pool.close()
