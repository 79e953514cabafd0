"""A lane's other candidate processes are stopped while one process holds it alone (evaluation/parking.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optagent.evaluation.gates import Gate
from optagent.evaluation.lanes import Lane
from optagent.evaluation.parking import marked_pids
from optagent.evaluation.worker_command import MARKER
from optagent.messages import Compiled, LaneReleased, LaneWanted, Phase
from optagent.schema import Status

# a worker stand-in: a process that sleeps in slices, with a child that has left its process group (setsid)
SLEEPER = ("import os, time\n"
           "if os.fork() == 0:\n"
           "    os.setsid()\n"
           "while True:\n"
           "    time.sleep(0.01)\n")


def state(pid: int) -> str:
    """The kernel's state letter of a process (T: stopped)."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def stopped(pids: list[int], want: bool = True) -> bool:
    """Whether every one of pids is stopped (want) or none is, within a second: a signal takes effect as the process
    next runs, not as kill() returns."""
    deadline = time.monotonic() + 1.0
    while True:
        if all((state(p) == "T") == want for p in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def family(marker: str) -> list[int]:
    return sorted(marked_pids(marker))


@pytest.fixture
def sleepers():
    started: list[tuple[subprocess.Popen, str]] = []

    def start() -> tuple[subprocess.Popen, str, list[int]]:
        marker = os.urandom(8).hex()
        proc = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True,
                                env={**os.environ, MARKER: marker})
        started.append((proc, marker))
        deadline = time.monotonic() + 10
        def ready() -> bool:  # the child has forked and left the group
            pids = family(marker)
            return len(pids) == 2 and any(os.getpgid(p) != proc.pid for p in pids)
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready()
        pids = family(marker)
        return proc, marker, pids

    yield start
    for proc, marker in started:
        for pid in family(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)


def granted(gate: Gate, wait_s: float = 2.0) -> bool:
    ready, _, _ = select.select([gate.fds[0]], [], [], wait_s)
    return bool(ready) and os.read(gate.fds[0], 1) == b"\x01"


def member(lane: Lane, who: str, proc: subprocess.Popen, marker: str, compiled: bool = True) -> Gate:
    gate = Gate(lane, who)
    gate.fds = (os.dup(gate.fds[0]),)  # the test reads its grants where the child would: spawned closes ours
    gate.spawned(proc.pid, marker)
    if compiled:
        gate.on_message(Compiled(status=Status.PASSED))
    return gate


def holder(lane: Lane, who: str) -> Gate:
    gate = Gate(lane, who)
    gate.on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(gate)
    return gate


def test_a_compiled_process_is_stopped_while_another_times_and_continued_after(sleepers):
    lane = Lane(0, None)
    proc, marker, pids = sleepers()
    a = member(lane, "a", proc, marker)
    assert stopped(pids, False)
    t = holder(lane, "t")
    assert stopped(pids)  # its child that left the group too
    time.sleep(0.3)
    t.on_message(LaneReleased(phase=Phase.TIMING))
    assert stopped(pids)  # a timed phase's word is not its end
    t.close()
    assert stopped(pids, False)
    assert 0.3 <= a.waited_in(Phase.CASE) < 5 and a.waited_s() == pytest.approx(a.waited_in(Phase.CASE), abs=0.05)
    assert lane.parking.stops == 1
    a.close()


def test_processes_that_have_not_compiled_are_never_stopped(sleepers):
    """A warm spare, a judge, a baseline job, a process still in its compiler: no candidate code runs there."""
    lane = Lane(0, None)
    proc, marker, pids = sleepers()
    spare = member(lane, "spare", proc, marker, compiled=False)
    t = holder(lane, "t")
    time.sleep(0.1)  # a stop sent would have taken effect by now
    assert stopped(pids, False)
    t.close()
    spare.close()
    assert lane.parking.stops == 0


def test_a_process_that_compiles_during_a_hold_is_stopped_at_once_and_one_that_ended_is_forgotten(sleepers):
    lane = Lane(0, None)
    (p1, m1, pids1), (p2, m2, pids2) = sleepers(), sleepers()
    t = holder(lane, "t")
    late = member(lane, "late", p1, m1)
    assert stopped(pids1)
    gone = member(lane, "gone", p2, m2)
    gone.close()  # its process ended (here it still runs): it is no member any more, and nobody continues it
    t.close()
    assert stopped(pids1, False) and stopped(pids2)
    for p in pids2:
        os.kill(p, signal.SIGCONT)
    late.close()


def test_a_correctness_run_past_the_timed_phases_wait_is_stopped_not_timed_beside(sleepers):
    lane = Lane(0, None)
    lane.shared_wait_s, lane.member_wait_s = 30.0, 0.3  # a candidate's correctness phase: its own, shorter wait
    proc, marker, pids = sleepers()
    checking = member(lane, "checking", proc, marker)
    checking.on_message(LaneWanted(phase=Phase.CASE))
    assert granted(checking)
    t = Gate(lane, "t")
    t0 = time.monotonic()
    t.on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(t, 5.0) and 0.25 <= time.monotonic() - t0 < 5.0
    assert stopped(pids)
    t.close()
    assert stopped(pids, False)
    checking.on_message(LaneReleased(phase=Phase.CASE))
    checking.close()


def test_a_judges_shared_hold_is_waited_for_longer_than_a_candidates_and_neither_past_its_bound(sleepers):
    """A judge (trusted: never stopped) finishes its checks before a timed phase starts, up to SHARED_WAIT_S; a
    candidate process's correctness phase (its compiles, its checked runs) holds a timed phase up to MEMBER_WAIT_S
    only, and is stopped from then on."""
    lane = Lane(0, None)
    lane.shared_wait_s, lane.member_wait_s = 1.5, 0.2
    proc, marker, pids = sleepers()
    checking = member(lane, "checking", proc, marker)
    checking.on_message(LaneWanted(phase=Phase.CASE))
    assert granted(checking)
    judge = lane.shared(("checking", "judges"))  # the parent's own hold, as Gate.shared_hold gives it
    judge.__enter__()
    t = Gate(lane, "t")
    t0 = time.monotonic()
    t.on_message(LaneWanted(phase=Phase.TIMING))
    assert not granted(t, 1.0) and stopped(pids, False)  # the judge's hold is waited for
    assert granted(t, 3.0) and 1.4 <= time.monotonic() - t0 < 3.0  # ... at most its bound
    assert stopped(pids)
    judge.__exit__(None, None, None)
    t.close()
    assert stopped(pids, False)
    t2 = Gate(lane, "t2")
    t1 = time.monotonic()
    t2.on_message(LaneWanted(phase=Phase.TIMING))  # the candidate's phase alone: its shorter bound
    assert granted(t2, 3.0) and 0.15 <= time.monotonic() - t1 < 1.0
    assert stopped(pids)
    t2.close()
    checking.on_message(LaneReleased(phase=Phase.CASE))
    checking.close()


def test_a_process_stopped_while_it_waits_for_its_hold_is_not_counted_twice(sleepers):
    lane = Lane(0, None)
    proc, marker, _ = sleepers()
    t = holder(lane, "t")
    parked = member(lane, "parked", proc, marker)
    parked.on_message(LaneWanted(phase=Phase.TIMING))  # it waits for the lane while it is stopped
    time.sleep(0.4)
    t.close()
    assert granted(parked)
    assert parked.waited_s() == pytest.approx(parked.waited_in(Phase.TIMING), abs=0.05)
    assert parked.waited_in(Phase.CASE) < 0.05  # stopped before it asked: only that moment
    parked.close()



def test_the_next_holder_runs_and_the_others_stay_stopped_as_the_lane_passes(sleepers):
    """One process stopped while it waited for its timed phase gets the lane as the holder ends: it runs, the
    third member stays stopped for it (the handover is one step: no new holder finds it still stopped)."""
    lane = Lane(0, None)
    (p1, m1, next_pids), (p2, m2, third_pids) = sleepers(), sleepers()
    t = holder(lane, "t")
    nxt, third = member(lane, "next", p1, m1), member(lane, "third", p2, m2)
    nxt.on_message(LaneWanted(phase=Phase.TIMING))
    assert stopped(next_pids) and stopped(third_pids) and not granted(nxt, 0.2)
    t.close()
    assert granted(nxt) and stopped(next_pids, False)
    time.sleep(0.1)
    assert stopped(third_pids)
    nxt.close()
    assert stopped(third_pids, False)
    third.close()

# ------------------------------------------------------------------ a real pool: a neighbour's signal handler
# Candidate code outside any hold of its process's: an interval timer whose handler runs every 5 ms, in the checking
# phase and while the harness waits for its timed phase's grant (a signal interrupts that wait and Python runs the
# handler). On a GPU the handler could launch work beside another candidate's timed calls. Here it writes down each
# stretch in which it did not run (a gap): stopped, it runs for none of the neighbour's timed phase.
TICKS = (
    "    import signal, sys, time\n"
    "    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n"
    "    if run_kernel.calls == 1:\n"
    "        last = [time.monotonic()]\n"
    "        def tick(sig, frame):\n"
    "            now = time.monotonic()\n"
    "            if now - last[0] > 0.05:\n"
    "                sys.stdout.write(f'gap {last[0]:.4f} {now:.4f}\\n')\n"
    "                sys.stdout.flush()\n"
    "            last[0] = now\n"
    "        signal.signal(signal.SIGALRM, tick)\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)\n"
    "    if run_kernel.calls <= 2:\n"
    "        time.sleep(2.0)\n"
    "    elif run_kernel.calls == 3:\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0)\n")
# checked in 1 s a call (the other has long set its timer by then), then timed at 0.1 s a call: its timed phase
# comes while the other is still checking
TIMED_SLOWLY = ("    import time\n    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n"
                "    time.sleep(1.0 if run_kernel.calls <= 2 else 0.1)\n")


def test_a_neighbours_signal_handler_never_runs_beside_a_timed_phase(task_dir):
    from test_pool import evaluator, with_body

    from optagent.evaluation.pool import LocalPool
    from optagent.protocols import PoolJob
    from optagent.schema import Language
    from optagent.task import load_task

    task = load_task(task_dir)
    starter = task.starter(Language.TRITON).source
    pool = LocalPool(evaluator(task), jobs=2, devices=[None])
    got = {job.key: r for job, r in pool.evaluate([PoolJob(0, with_body(starter, TICKS), Language.TRITON),
                                                    PoolJob(1, with_body(starter, TIMED_SLOWLY), Language.TRITON)])}
    pool.close()
    assert got[1].status is Status.PASSED, got[1].reason
    holds = sorted((h for h in pool.lane_list[0].holds if not isinstance(h.who, tuple)), key=lambda h: h.granted)
    assert len(holds) == 2
    timed = holds[0]  # the neighbour's: it timed first, while the ticking process still checked its kernel
    assert timed.released - timed.granted > 0.3
    gaps = [tuple(map(float, line.split()[1:])) for line in (got[0].log_tail or "").splitlines()
            if line.startswith("gap ")]
    assert any(a <= timed.granted + 0.25 and b >= timed.released for a, b in gaps), (gaps, timed)
    assert pool.lane_list[0].parking.stops >= 1


# On a GPU: the same handler launches 2.5 ms of spinning on a side stream at every tick, never synchronised: while
# it ran beside another candidate's timed calls, the GPU's time slices between the two contexts stretched them.
SPINS = (
    "    import signal, time, torch\n"
    "    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n"
    "    if run_kernel.calls == 1:\n"
    "        side = torch.cuda.Stream()\n"
    "        def spin(sig, frame):\n"
    "            with torch.cuda.stream(side):\n"
    "                torch.cuda._sleep(5_000_000)\n"
    "        signal.signal(signal.SIGALRM, spin)\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)\n"
    "    if run_kernel.calls <= 2:\n"
    "        time.sleep(1.5)\n"
    "    elif run_kernel.calls == 3:\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0)\n")


@pytest.mark.gpu
def test_on_a_gpu_a_neighbours_kernels_launched_from_a_signal_handler_do_not_stretch_a_timed_phase(task_dir):
    from optagent.evaluation.cases import select_cases
    from optagent.evaluation.evaluator import SandboxEvaluator
    from optagent.evaluation.pool import LocalPool
    from optagent.protocols import PoolJob
    from optagent.schema import Language
    from optagent.task import load_task
    from test_pool import with_body

    task = load_task(task_dir)
    starter = task.starter(Language.TRITON).source
    ev = SandboxEvaluator(task, "cuda", select_cases(task, "cuda", 12, "1", hidden=False), static_scan=False)
    pool = LocalPool(ev, jobs=2)
    try:
        alone = next(r for _, r in pool.evaluate([PoolJob(0, starter, Language.TRITON)]))
        got = {job.key: r for job, r in pool.evaluate([PoolJob(1, with_body(starter, SPINS), Language.TRITON),
                                                        PoolJob(2, starter + "\n# again\n", Language.TRITON)])}
    finally:
        pool.close()
    assert alone.status is Status.PASSED and got[2].status is Status.PASSED, (alone.reason, got[2].reason)
    assert pool.alone_runs == 0  # not rescued by a run alone: it was never timed beside the spinning
    assert got[2].geomean_time_us < 1.15 * alone.geomean_time_us, (got[2].geomean_time_us, alone.geomean_time_us)
    assert pool.lane_list[0].parking.stops >= 1
