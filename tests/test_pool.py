"""The local evaluation pool on CPU: K evaluations at once, timing serialised per lane (2 lanes here)."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import pytest

from attack_fixtures import aborted
from optagent.cli.main import main
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation import gates
from optagent.evaluation.gates import Gate
from optagent.evaluation.lanes import Hold, Lane, OrderedLane
from optagent.evaluation.pool import LocalPool
from optagent.messages import LaneReleased, LaneWanted, Phase
from optagent.protocols import Pool, PoolJob
from optagent.schema import Language, Status
from optagent.task import load_task

ATTACKS = Path(__file__).resolve().parent / "attacks"
RUN_KERNEL = "def run_kernel(\n"
# after its two checked calls (the package's inputs, fresh ones), the kernel is being timed
IN_TIMING = "    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n    if run_kernel.calls > 2:\n"


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


@pytest.fixture(scope="module")
def starter(task):
    return task.starter(Language.TRITON).source


def with_body(starter: str, prologue: str) -> str:
    head, sep, rest = starter.partition(RUN_KERNEL)
    signature, colon, body = rest.partition("):\n")
    return head + sep + signature + colon + prologue + body


def evaluator(task, timeout: float = 150.0) -> SandboxEvaluator:
    # the scan off: the attack must reach the process, to be judged there beside its neighbours
    return SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=timeout,
                            static_scan=False)


def overlapping(holds: list[Hold]) -> bool:
    spans = sorted((h.granted, h.released) for h in holds)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


# ------------------------------------------------------------------ the lanes themselves (no process)

def granted(gate: Gate, wait_s: float = 2.0) -> bool:
    ready, _, _ = select.select([gate.fds[0]], [], [], wait_s)
    return bool(ready) and os.read(gate.fds[0], 1) == b"\x01"


def test_two_lanes_time_at_once_one_lane_one_at_a_time():
    lane0, lane1 = Lane(0, "0"), Lane(1, "1")
    a, b, c = Gate(lane0, "a"), Gate(lane1, "b"), Gate(lane0, "c")
    assert a.env["CUDA_VISIBLE_DEVICES"] == "0" and b.env["CUDA_VISIBLE_DEVICES"] == "1"
    for g in (a, b, c):
        g.on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(a) and granted(b)  # one on each GPU, at once
    assert not granted(c, 0.5)  # lane 0 is a's
    assert c.waited_s() > 0.4
    a.close()  # a's process died holding the lane: it is free
    assert granted(c)
    c.on_message(LaneReleased(phase=Phase.TIMING))
    b.on_message(LaneReleased(phase=Phase.TIMING))
    for g in (b, c):
        g.close()
    assert all(h.released for h in lane0.holds + lane1.holds)
    assert not overlapping(lane0.holds) and [h.who for h in lane0.holds] == ["a", "c"]
    assert lane0.holds[0].granted < lane1.holds[0].released and lane1.holds[0].granted < lane0.holds[0].released


def test_an_ordered_lane_grants_in_order_and_skips_a_finished_turn():
    base = Lane(0, None)
    ordered = OrderedLane(base, [0, 1, 2])
    gates = [Gate(ordered, i) for i in range(3)]
    gates[2].on_message(LaneWanted(phase=Phase.TIMING))
    assert not granted(gates[2], 0.3)  # 0 and 1 come first
    gates[0].close()  # 0 ended before it timed (a compile error): its turn passes
    gates[1].on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(gates[1]) and not granted(gates[2], 0.3)
    gates[1].on_message(LaneReleased(phase=Phase.TIMING))
    assert not granted(gates[2], 0.3)  # a timed phase's word is not its end: its process may still run code
    gates[1].close()
    assert granted(gates[2])
    gates[2].close()
    assert [h.who for h in base.holds] == [1, 2] and not overlapping(base.holds)


def test_shared_holds_run_side_by_side_and_never_beside_a_timed_phase():
    lane = Lane(0, "0")
    a, b, t, c = (Gate(lane, w) for w in "abtc")
    a.on_message(LaneWanted(phase=Phase.CASE))
    b.on_message(LaneWanted(phase=Phase.CASE))
    assert granted(a) and granted(b)  # two correctness phases at once
    t.on_message(LaneWanted(phase=Phase.TIMING))
    assert not granted(t, 0.3)  # the timed phase waits for both to end...
    c.on_message(LaneWanted(phase=Phase.CASE))
    assert not granted(c, 0.3)  # ...and no new shared hold starts while it waits
    a.on_message(LaneReleased(phase=Phase.CASE))
    assert not granted(t, 0.2)  # b still checks its kernel
    b.on_message(LaneReleased(phase=Phase.CASE))
    assert granted(t)
    assert not granted(c, 0.3)  # c's correctness runs wait for the timed phase
    with_judges = threading.Event()

    def judges() -> None:  # the parent's own shared hold (evaluator.py: its judges)
        with a.shared_hold("judges"):
            with_judges.set()

    threading.Thread(target=judges, daemon=True).start()
    assert not with_judges.wait(0.3)
    t.close()  # its process ended (its LaneReleased alone would not do: HELD_TO_THE_END)
    assert granted(c) and with_judges.wait(2.0)
    assert t.waited_in(Phase.TIMING) > 0.5 and c.waited_in(Phase.CASE) > 0.5 and t.waited_in(Phase.CASE) == 0.0
    assert t.waited_s() == pytest.approx(t.waited_in(Phase.TIMING))
    for g in (a, b, t, c):
        g.close()
    assert [h.who for h in lane.holds] == ["t"] and lane.holds[0].released


def test_a_timed_phase_waits_for_shared_holds_at_most_its_bound_and_a_dead_holder_frees_the_lane():
    lane = Lane(0, "0")
    lane.shared_wait_s = 0.4
    hung, t, dead, waiting = (Gate(lane, w) for w in ("hung", "t", "dead", "waiting"))
    hung.on_message(LaneWanted(phase=Phase.CASE))
    assert granted(hung)
    t0 = time.monotonic()
    t.on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(t, 2.0)  # the shared hold never ended: the timed phase went ahead at its bound
    assert 0.35 <= time.monotonic() - t0 < 1.5
    waiting.on_message(LaneWanted(phase=Phase.CASE))
    waiting.close()  # its process ended while it waited: out of the wait
    t.close()
    hung.close()  # its process ended holding the lane shared: the next timed phase waits for nothing
    dead.on_message(LaneWanted(phase=Phase.CASE))
    assert granted(dead)
    dead.close()
    t2 = Gate(lane, "t2")
    t1 = time.monotonic()
    t2.on_message(LaneWanted(phase=Phase.TIMING))
    assert granted(t2) and time.monotonic() - t1 < 0.3
    for g in (t, t2):
        g.close()
    assert not lane._sharing and not lane._share_queue


# ------------------------------------------------------------------ real evaluations, 2 lanes, K = 4

@pytest.fixture(scope="module")
def round_of_four(task, starter):
    ev = evaluator(task)
    ev.shared_checks = True  # as on a GPU: correctness runs and judges hold the lane shared
    pool = LocalPool(ev, jobs=4, devices=[None, None])
    assert isinstance(pool, Pool) and pool.lanes == 2
    for lane in pool.lane_list:
        lane.shared_wait_s = 600.0  # a slow host's judges are waited for, and its candidates' checks stopped
        # after MEMBER_WAIT_S (parking.py): so that none overlaps a timed phase here
    dies = with_body(starter, "    import os\n" + IN_TIMING + "        os.abort()\n")
    jobs = [PoolJob(0, starter, Language.TRITON), PoolJob(1, (ATTACKS / "fork_bomb.py").read_text(), Language.TRITON),
            PoolJob(2, dies, Language.TRITON), PoolJob(3, starter, Language.TRITON)]
    t0 = time.monotonic()
    seen = [(job.key, result) for job, result in pool.evaluate(jobs)]
    wall = time.monotonic() - t0
    pool.close()
    return pool, seen, wall


def test_every_job_is_yielded_once_with_its_own_verdict(round_of_four):
    _, seen, _ = round_of_four
    assert sorted(k for k, _ in seen) == [0, 1, 2, 3]
    got = dict(seen)
    for k in (0, 3):
        assert got[k].status is Status.PASSED, got[k].reason  # neighbours of the attack and the crash
        assert all(c.time_us and c.baseline_us for c in got[k].cases)
    assert got[1].status is Status.REJECTED and "fork" in got[1].reason  # the audit guard, as without a pool
    assert got[2].status is Status.RUNTIME_ERROR and aborted(got[2].reason), got[2].reason


def test_timing_never_overlaps_on_a_lane_and_a_dead_holder_frees_it(round_of_four):
    pool, _, _ = round_of_four
    for lane in pool.lane_list:
        assert lane.holds, f"lane {lane.index} timed nothing"
        assert all(h.released for h in lane.holds)  # the process that aborted mid-timing released too
        assert not overlapping(lane.holds)
    assert pool.baseline_runs == 2  # once per lane, reused


def test_correctness_runs_and_judges_hold_the_lane_shared_never_beside_its_timed_phases(round_of_four):
    pool, seen, _ = round_of_four
    shared = [h for lane in pool.lane_list for h in lane.shared_holds]
    judged = [h for h in shared if isinstance(h.who, tuple) and h.who[-1] == "judges"]
    assert len(judged) == 2 and len(shared) >= 2 + 2  # the two passing kernels' checks and their judges
    for lane in pool.lane_list:
        assert all(h.released for h in lane.shared_holds)  # the aborted process's too
        for s in lane.shared_holds:
            assert not any(s.granted < t.released and t.granted < s.released for t in lane.holds), (s, lane.holds)


def test_the_cost_split_is_present_and_sums_to_about_wall_s(round_of_four):
    _, seen, _ = round_of_four
    for key, result in seen:
        if result.status is Status.PASSED:
            c = result.costs
            assert c.imports > 0 and c.correctness > 0 and c.timing > 0 and c.judge > 0
            assert abs(c.total - result.wall_s) < max(1.5, 0.1 * result.wall_s), (c, result.wall_s)


def test_retime_runs_back_to_back_on_one_lane_in_order(task, starter):
    pool = LocalPool(evaluator(task), jobs=2, devices=[None, None])
    slower = with_body(starter, "    import time\n    time.sleep(0.3)\n")
    results = pool.retime([PoolJob(5, starter, Language.TRITON), PoolJob(6, slower, Language.TRITON)])
    pool.close()
    assert [r.status for r in results] == [Status.PASSED, Status.PASSED]
    assert results[1].cases[0].time_us > results[0].cases[0].time_us  # in the order given
    holds = pool.lane_list[0].holds
    ours = [h for h in holds if isinstance(h.who, int)]
    assert [h.who for h in ours] == [0, 1] and not overlapping(ours)
    retime = next(h for h in holds if isinstance(h.who, tuple) and h.who[0] == "retime")
    assert all(retime.granted <= h.granted and h.released <= retime.released for h in ours)  # nothing between
    assert not pool.lane_list[1].holds
    assert results[0].cases[0].baseline_us == results[1].cases[0].baseline_us  # one baseline: side by side


# Candidate code that runs on after its timed phase has said it is over: the harness's channel patched (the scan
# off) so that, once the worker has told LaneReleased for its timed phase, the process sleeps LINGER_S before its Done.
LINGER_S = 3.0
LINGERS = (
    "    import sys, time\n"
    "    messages = sys.modules['optagent.messages']\n"
    "    if not getattr(messages.Channel.send, 'lingers', False):\n"
    "        real = messages.Channel.send\n"
    "        def send(self, msg, real=real):\n"
    "            real(self, msg)\n"
    "            if type(msg).__name__ == 'LaneReleased' and msg.phase.value == 'timing':\n"
    f"                time.sleep({LINGER_S})\n"
    "        send.lingers = True\n"
    "        messages.Channel.send = send\n")
# its two checked calls take 1.5 s each: it wants the lane while the kernel beside it is timed
CHECKS_SLOWLY = ("    import time\n    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n"
                 "    if run_kernel.calls <= 2:\n        time.sleep(1.5)\n")


def test_a_timed_phase_holds_its_lane_until_its_process_has_ended(task, starter):
    """What a candidate's process does after its timed phase (here: sleep; as well: launch work on the GPU) never
    runs beside another process's timed phase: the parent takes the lane back at the process's end, not at its word."""
    pool = LocalPool(evaluator(task), jobs=2, devices=[None])
    late = with_body(starter, CHECKS_SLOWLY)
    got = {job.key: r for job, r in pool.evaluate([PoolJob(0, with_body(starter, LINGERS), Language.TRITON),
                                                    PoolJob(1, late, Language.TRITON)])}
    pool.close()
    assert got[0].status is Status.PASSED and got[1].status is Status.PASSED, (got[0].reason, got[1].reason)
    holds = [h for h in pool.lane_list[0].holds if not isinstance(h.who, tuple)]  # not the baseline job's
    assert len(holds) == 2 and not overlapping(holds)
    first = min(holds, key=lambda h: h.granted)
    assert first.released - first.granted >= LINGER_S  # its process's end, not its LaneReleased
    assert got[0].costs.ending >= LINGER_S * 0.9  # the linger was after the timed phase, as the cost split says


def test_a_process_that_does_not_end_after_its_timed_phase_is_stopped_and_frees_the_lane(task, starter, monkeypatch):
    """Held until its end, a lane is not the candidate's to keep: past the grace it is stopped, and fails for it."""
    monkeypatch.setattr(gates, "ENDING_GRACE_S", 1.0)
    pool = LocalPool(evaluator(task), jobs=2, devices=[None])
    forever = LINGERS.replace(f"time.sleep({LINGER_S})", "time.sleep(600)")
    late = with_body(starter, CHECKS_SLOWLY)
    got = {job.key: r for job, r in pool.evaluate([PoolJob(0, with_body(starter, forever), Language.TRITON),
                                                    PoolJob(1, late, Language.TRITON)])}
    pool.close()
    assert got[0].status is Status.RUNTIME_ERROR and "did not end within 1 s of its timed phase" in got[0].reason
    assert got[1].status is Status.PASSED, got[1].reason
    holds = sorted((h for h in pool.lane_list[0].holds if not isinstance(h.who, tuple)), key=lambda h: h.granted)
    assert len(holds) == 2 and not overlapping(holds)
    assert holds[0].released - holds[0].granted < 30  # the grace and a kill, not the 600 s sleep nor the timeout


def test_a_process_stopped_at_a_limit_while_timed_frees_the_lane(task, starter):
    """A limit (here: output) broken in a timed phase stops the process; it is taken down all the same, so its lane
    is free for the next (it was not, once: the neighbour waited for the lane until the pool closed)."""
    pool = LocalPool(evaluator(task, timeout=120.0), jobs=2, devices=[None])
    floods = with_body(starter, IN_TIMING + "        import sys\n        for _ in range(100):\n"
                                "            sys.stdout.write('x' * (1 << 20) + '\\n')\n")
    late = with_body(starter, CHECKS_SLOWLY)
    got: dict = {}
    stop = threading.Event()

    def evaluate() -> None:
        got.update({job.key: r for job, r in pool.evaluate([PoolJob(0, floods, Language.TRITON),
                                                             PoolJob(1, late, Language.TRITON)], stop=stop)})
    runs = threading.Thread(target=evaluate, daemon=True)
    runs.start()
    runs.join(240)
    stuck = runs.is_alive()
    if stuck:  # a lane never freed: no verdict ever comes (stop ends the evaluations)
        stop.set()
        runs.join(60)
    pool.close()
    assert not stuck, "the neighbour never got the lane"
    assert got[0].status is Status.RUNTIME_ERROR and "MiB of output" in got[0].reason, got[0].reason
    assert got[1].status is Status.PASSED, got[1].reason
    assert got[1].costs.lane_wait < 30  # not the flooder's timeout
    assert all(h.released for h in pool.lane_list[0].holds)


def test_waiting_for_the_lane_does_not_count_against_the_timeout(task, starter):
    timeout = 60.0
    pool = LocalPool(evaluator(task, timeout=timeout), jobs=2, devices=[None])
    hangs = with_body(starter, IN_TIMING + "        while True:\n            pass\n")
    late = with_body(starter, "    import time\n    run_kernel.calls = getattr(run_kernel, 'calls', 0) + 1\n"
                              "    if run_kernel.calls <= 2:\n        time.sleep(4)\n")  # asks for the lane after the hanger
    got = {job.key: r for job, r in pool.evaluate([PoolJob(0, hangs, Language.TRITON),
                                                    PoolJob(1, late, Language.TRITON)])}
    pool.close()
    assert got[0].status is Status.TIMEOUT
    assert got[1].status is Status.PASSED, got[1].reason
    assert got[1].costs.lane_wait > 10 and got[1].wall_s > timeout  # it waited for the hanger's timeout


def test_eval_prints_the_cost_split(task_dir, capsys):
    kernel = task_dir / "starter" / "decode_triton.py"
    code = main(["eval", str(task_dir), str(kernel), "--device", "cpu", "--no-hidden", "--json"])
    out = capsys.readouterr()
    assert code == 0
    assert "cost " in out.err and "imports" in out.err and "judge" in out.err
    assert '"costs"' in out.out


def test_a_lane_baseline_is_timed_again_for_drift_at_most_once_a_minute(monkeypatch):
    """The host probe drifts with whatever else the host does: a baseline job (seconds of the lane) is not
    re-run for it before MIN_AGE_S; after that, a slow baseline or a moved probe re-runs it; MAX_AGE_S always."""
    from concurrent.futures import Future

    from optagent.evaluation import pool as pool_module

    def done(age_s: float, slow: bool = False, probe_us: float = 10.0) -> Future:
        f: Future = Future()
        f.set_result(pool_module.LaneBaseline([], probe_us, time.monotonic() - age_s, slow))
        return f

    monkeypatch.setattr(pool_module, "_host_probe", lambda: 20.0)  # twice the baseline's probe: drifted
    assert pool_module._stale(done(5.0)) is None
    assert pool_module._stale(done(5.0, slow=True)) is None
    assert "moved from 10.0 to 20.0" in pool_module._stale(done(pool_module.MIN_AGE_S + 1))
    assert "slow host" in pool_module._stale(done(pool_module.MIN_AGE_S + 1, slow=True))
    assert "old" in pool_module._stale(done(pool_module.MAX_AGE_S + 1))
    monkeypatch.setattr(pool_module, "_host_probe", lambda: 10.5)
    assert pool_module._stale(done(pool_module.MIN_AGE_S + 1)) is None
    failed: Future = Future()
    failed.set_exception(RuntimeError("x"))
    assert "failed" in pool_module._stale(failed)


class _Starting:
    """A warm worker as Spares.settle sees one: warm once `at` has passed (never, for None)."""

    def __init__(self, at):
        self.at = at

    def warm(self, timeout_s: float) -> bool:
        if self.at is not None and time.monotonic() + timeout_s >= self.at:
            time.sleep(max(0.0, self.at - time.monotonic()))
            return True
        time.sleep(min(timeout_s, 0.05))
        return False


def test_a_lane_is_granted_once_its_starting_processes_are_warm_and_a_hung_one_is_waited_for_once():
    from optagent.evaluation.warm_worker import Spares

    spares = Spares(lambda: None, 1.0, 0)
    try:
        lane = Lane(0, None)
        lane.settle = lambda: spares.settle(None, 0.6)
        soon = _Starting(time.monotonic() + 0.3)
        spares._starting[None] = [soon]
        t0 = time.monotonic()
        assert lane.acquire("a")
        assert 0.25 <= lane.holds[0].granted - t0 < 0.55  # granted once the starting process said it was warm
        lane.release("a")
        hung = _Starting(None)
        spares._starting[None] = [hung]
        t0 = time.monotonic()
        assert lane.acquire("b")
        assert lane.holds[1].granted - t0 >= 0.55  # waited the whole bound for it...
        lane.release("b")
        t0 = time.monotonic()
        assert lane.acquire("c")
        assert lane.holds[2].granted - t0 < 0.2  # ...and not again
        lane.release("c")
    finally:
        spares.close()
