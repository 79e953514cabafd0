"""The parent's reading of the native timer's records (evaluation/timer_check.py), with canned records."""

from __future__ import annotations

import json

from optagent.evaluation.timer_check import check_records, with_timings
from optagent.messages import Baseline, CaseRan, CaseSpec, Job, NativeTimerSpec
from optagent.schema import CaseKind, CaseResult, Device, Status, Timing
from optagent.timer_records import LoopKind, parse_reports

SECRET = bytes(range(32))
T = Timing(median_us=50.0, p10_us=40.0, p90_us=60.0, samples=20)
JOB = Job(mode="candidate", task_dir="t", device=Device.CUDA, nonce="n", scratch="s", seed=1000,
          cases=[CaseSpec(label="1", kind=CaseKind.CONTEST, index=1), CaseSpec(label="h", kind=CaseKind.HIDDEN)],
          timer=NativeTimerSpec(path="x.so", sha256="0" * 64))


class Pipe:
    """Lines as timer.c writes them, stamped with the parent's arrival times."""

    def __init__(self):
        self.lines: list[tuple[float, bytes]] = []
        self.seq = 0

    def add(self, at: float, body: dict, secret: bytes = SECRET) -> None:
        self.seq += 1
        self.lines.append((at, secret.hex().encode() + b" " + json.dumps({"seq": self.seq, **body}).encode()))

    def loop(self, case: str, kind: str, t0: float, t1: float, loop_s: float, median: float = 50.0,
             host_slow: bool = False, check=((1, 0, None), (2, 1, 77)), n_keep=None, after: float = 400.0) -> None:
        self.add(t0, {"type": "start", "case": case, "kind": kind})
        self.add(t1, {"type": "end", "case": case, "kind": kind, "median_us": median, "p10_us": median,
                      "p90_us": median, "samples": 20, "calls": 20, "host_slow": host_slow, "slow_host_calls": 0,
                      "loop_s": loop_s, "after_us": after, "n_keep": len(check) if n_keep is None else n_keep,
                      "check": [list(c) for c in check] if kind != "baseline" else []})

    def check(self, baselines=("1",), ran=("1",), gpu=False, job=JOB):
        records, foreign = parse_reports(self.lines, SECRET)
        return check_records(job, records, foreign, [Baseline(case=c, timing=T, sizes="") for c in baselines],
                             [CaseRan(case=c, samples=[], load_ms=1.0, timing=T, gpu=T if gpu else None) for c in ran])


def honest(gpu: bool = False, eager_after: float = 430.0, gpu_after: float = 380.0) -> Pipe:
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, median=100.0, check=(), after=400.0)
    p.loop("1", "eager", 1.0, 1.4, 0.39, median=50.0, after=eager_after)
    if gpu:
        p.loop("1", "gpu", 2.0, 2.3, 0.3, median=20.0, check=((9, 2, 5),), after=gpu_after)
    return p


def test_honest_records_give_the_timings_and_the_calls_to_judge():
    got = honest(gpu=True).check(gpu=True)
    assert got.reason is None
    assert got.timings[("1", LoopKind.EAGER)].median_us == 50.0
    assert got.timings[("1", LoopKind.BASELINE)].median_us == 100.0
    assert got.timings[("1", LoopKind.GPU)].median_us == 20.0
    names = [(e.name, e.base_seed, e.refresh_seed) for e in got.expected["1"]]
    assert names == [("timed-call1", 1000, None), ("timed-call2", 1000 + 7919, 77), ("timed-call9", 1000 + 2 * 7919, 5)]


def test_a_loop_shorter_than_the_parents_wall_clock_is_rejected():
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, check=())
    p.loop("1", "eager", 1.0, 3.0, 0.5)  # the parent saw 2 s between the records; the timer says 0.5 s
    assert "its timing contradicts the wall clock" in p.check().reason
    ok = Pipe()
    ok.loop("1", "baseline", 0.0, 0.5, 0.49, check=())
    ok.loop("1", "eager", 1.0, 1.2, 0.07)  # within the slack: the pipe was read a little late
    assert ok.check().reason is None


def test_an_extra_loop_is_rejected_and_a_second_try_after_a_slow_host_is_not():
    p = honest()
    p.loop("1", "eager", 2.0, 2.1, 0.1, median=1.0)  # the candidate timing a no-op under the case's name
    assert "an extra eager timing record" in p.check().reason
    slow = Pipe()
    slow.loop("1", "baseline", 0.0, 0.5, 0.49, check=())
    slow.loop("1", "eager", 1.0, 1.4, 0.39, median=80.0, host_slow=True)
    slow.loop("1", "eager", 2.0, 2.4, 0.39, median=60.0)
    got = slow.check()
    assert got.reason is None and got.timings[("1", LoopKind.EAGER)].median_us == 60.0
    assert len(got.expected["1"]) == 4  # both tries' calls are judged
    hidden = honest()
    hidden.loop("h", "eager", 2.0, 2.1, 0.1)  # hidden cases are never timed
    assert "extra" in hidden.check().reason


def test_missing_records_and_foreign_lines_are_rejected():
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, check=())
    assert "no eager timing record" in p.check().reason
    assert "no gpu timing record" in honest().check(gpu=True).reason
    forged = honest()
    forged.lines.append((5.0, b'{"type":"end","case":"1"}'))
    assert "carried 1 line(s) not written by the harness's timer" in forged.check().reason
    wrong_key = honest()
    wrong_key.add(6.0, {"type": "start", "case": "1", "kind": "gpu"}, secret=b"\x01" * 32)
    assert "not written by the harness's timer" in wrong_key.check().reason
    unpaired = Pipe()
    unpaired.add(0.0, {"type": "start", "case": "1", "kind": "eager"})
    unpaired.add(0.1, {"type": "start", "case": "1", "kind": "eager"})
    assert "started inside another" in unpaired.check(baselines=(), ran=()).reason


def test_a_record_that_keeps_too_few_calls_is_rejected():
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, check=())
    p.loop("1", "eager", 1.0, 1.4, 0.39, check=((1, 0, None),), n_keep=4)  # 20 calls, n_keep 4: 4 distinct
    assert "kept fewer timed calls" in p.check().reason


def test_the_timers_figures_replace_the_candidates_claims():
    got = honest().check()
    claimed = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time_us=0.001,
                         time=Timing(median_us=0.001, p10_us=0.001, p90_us=0.001, samples=3), baseline_us=1e6)
    (row,) = with_timings([claimed], got.timings)
    assert (row.time_us, row.baseline_us, row.speedup) == (50.0, 100.0, 2.0)


def test_work_moved_between_the_timed_calls_is_rejected_in_either_loop():
    """The baseline's loop spent 400 us a call on the harness's after-work; the slack on CUDA is 500 us."""
    assert honest(gpu=True, eager_after=890.0).check(gpu=True).moved is None
    for eager, gpu, kind in ((950.0, 380.0, "eager"), (400.0, 1500.0, "gpu")):
        why = honest(gpu=True, eager_after=eager, gpu_after=gpu).check(gpu=True).moved
        assert why and f"({kind} loop)" in why and "moved out of the timed window" in why, why
    timings = honest().check().timings
    assert timings[("1", LoopKind.EAGER)].after_us == 430.0  # told in the result, beside the time


def test_the_moved_work_reference_is_the_lane_baseline_jobs_when_the_pool_timed_it():
    """A pool's candidate job times no baseline: the reference is the baseline job's checked figure."""
    pooled = JOB.model_copy(update={"time_baseline": False})
    p = Pipe()
    p.loop("1", "eager", 1.0, 1.4, 0.39, median=50.0, after=2000.0)
    records, foreign = parse_reports(p.lines, SECRET)
    ran = [CaseRan(case="1", samples=[], load_ms=1.0, timing=T)]
    for base_after, bad in ((1900.0, False), (400.0, True), (None, False)):  # None: an older baseline job's
        base = [Baseline(case="1", timing=T.model_copy(update={"after_us": base_after}), sizes="")]
        why = check_records(pooled, records, foreign, base, ran).moved
        assert bool(why) is bad, why


def test_cpu_allows_the_interpreters_noise_but_not_a_kernels_worth():
    cpu = JOB.model_copy(update={"device": Device.CPU})
    assert honest(eager_after=15_000.0).check(job=cpu).moved is None  # 14.6 ms over a 0.4 ms reference
    assert honest(eager_after=90_000.0).check(job=cpu).moved is None  # a loaded host's 90 ms: the trial's case
    assert "moved out" in (honest(eager_after=140_000.0).check(job=cpu).moved or "")


def test_an_interval_shorter_than_the_timed_calls_themselves_is_not_moved_work():
    """A loaded host slows the harness's small operations; an honest kernel's calls still take longer."""
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, median=100.0, check=(), after=400.0)
    p.loop("1", "eager", 1.0, 1.4, 0.39, median=5000.0, after=4000.0)
    assert p.check().moved is None
    p = Pipe()
    p.loop("1", "baseline", 0.0, 0.5, 0.49, median=100.0, check=(), after=400.0)
    p.loop("1", "eager", 1.0, 1.4, 0.39, median=3000.0, after=4000.0)
    assert "moved out" in (p.check().moved or "")
