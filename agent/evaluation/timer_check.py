"""The parent's reading of the native timer's records: the only timings a verdict uses.

Pure (tested with canned records, tests/test_timer_check.py). Every line on the report
pipe must be a record of the timer's, under the parent's secret; each loop is a start and
its end; a case has at most the loops the harness makes (a baseline, an eager timing and
one more of each after a slow host, one GPU timing); each loop's duration by the timer's
clock must agree with the parent's own wall clock between the two records' arrivals; and
every call the timer chose for checking becomes a sample the judge must find; and the time
between a candidate's timed calls is no longer than the harness's own work there takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from optagent.messages import Baseline, CaseRan, ExpectedSample, Job
from optagent.schema import CaseKind, CaseResult, Device, Status, Timing
from optagent.timer_records import LoopKind, Stamped, TimerEnd, TimerStart, set_seed, timed_name

# The timer's loop may not be shorter than this share of the parent's interval between its
# start and end records, less a fixed slack for reading the pipe late: a pool's parent reads
# several workers' pipes from threads on a loaded host, and an honest kernel rejected for the
# parent's own lateness costs more than the slack (a forged record needs the secret anyway).
WALL_SHARE = 0.8
WALL_SLACK_S = 0.5
MAX_LOOPS = {LoopKind.BASELINE: 2, LoopKind.EAGER: 2, LoopKind.GPU: 1}
# Between two timed calls the harness keeps, poisons and redraws the same tensors in a
# candidate's loops as in the baseline's (worker/after_work.py), so the native timer's interval
# for that work is about the same in both. A candidate's interval longer by more than this share
# of the baseline's, and this many microseconds, is work moved out of the timed window into
# harness code it rebound (it shares the interpreter), not noise; a loop run on a slow host gets
# twice the share. The bound is loose: a redraw writes every input several times, so for a
# memory-bound kernel the after-work costs more than the kernel, and moving part of a kernel
# there stays under it (the floor check is the line for those). What it stops is a kernel moved
# out whole where its work exceeds the redraw's (compute-bound kernels, and any under the CPU
# interpreter). The excess must also exceed the timed call's own median: a kernel moved out
# leaves timed calls that do next to nothing, while an honest one's calls are where its time
# goes, whatever the host's load does to the harness's small tensor operations. CPU: honest
# Triton starters measured 0.5-2.2x the baseline's interval alone, and 10x (47 ms) on a loaded
# host, under interpreted calls of 140 ms and more (medians; the timer now reports the low decile,
# which a pool's compiles beside the timing move less). The GPU figures are a guess until the
# H200 measures the interval (tests/test_integrity.py prints it): 500 us covers a few hundred
# launches slowed by a busy host. CPU, in a model's trial on a host loaded 4x over its cores: honest
# candidates' intervals of 80-120 ms against a lane baseline timed when the host was quieter, over
# medians of 40-55 ms; so on a CPU the floor is 100 ms and the excess must be twice the median (a
# kernel moved out whole leaves calls that do nothing, and its interpreted work is far above both;
# a CPU's times rank nothing besides).
AFTER_SLACK = {Device.CUDA: (1.0, 500.0), Device.CPU: (3.0, 100_000.0)}
AFTER_OVER_MEDIAN = {Device.CUDA: 1.0, Device.CPU: 2.0}  # the excess over the timed median, in medians
MOVED = "work moved out of the timed window"  # the verdict's words, which a pool reads too (evaluation/pool.py)


@dataclass
class Checked:
    """What the records say per case, or why they cannot be trusted."""

    reason: Optional[str] = None
    # work moved out of the timed window: a rejection, but after the judge, whose INCORRECT says more
    moved: Optional[str] = None
    timings: dict[tuple[str, LoopKind], Timing] = field(default_factory=dict)
    expected: dict[str, list[ExpectedSample]] = field(default_factory=dict)
    # of those, the graph replays' (a display figure): the timer's own choice, also where a referee keeps the eager calls
    graph_expected: dict[str, list[ExpectedSample]] = field(default_factory=dict)


def _loops(records: list[Stamped]) -> tuple[list[tuple[Stamped, Stamped]], Optional[str]]:
    """Start/end pairs in order; a start the process never ended (it died there) is dropped."""
    loops: list[tuple[Stamped, Stamped]] = []
    open_: Optional[Stamped] = None
    for n, s in enumerate(records, 1):
        r = s.record
        if r.seq != n:
            return loops, f"the harness's timer records came out of order (record {r.seq} at place {n})"
        if isinstance(r, TimerStart):
            if open_ is not None:
                return loops, f"case {r.case}: a timing loop started inside another ({open_.record.case})"
            open_ = s
        else:
            o = open_.record if open_ else None
            if o is None or (o.case, o.kind) != (r.case, r.kind):
                return loops, f"case {r.case}: a {r.kind.value} timing record without its start"
            loops.append((open_, s))
            open_ = None
    return loops, None


def check_records(job: Job, records: list[Stamped], foreign: int, baselines: list[Baseline],
                  ran: list[CaseRan]) -> Checked:
    if foreign:
        return Checked(f"the timer's report pipe carried {foreign} line(s) not written by the harness's timer")
    loops, why = _loops(records)
    if why:
        return Checked(why)
    timed = {c.label for c in job.cases if c.kind is not CaseKind.HIDDEN}
    per: dict[tuple[str, LoopKind], list[TimerEnd]] = {}
    out = Checked()
    for start, end in loops:
        r = end.record
        assert isinstance(r, TimerEnd)
        key = (r.case, r.kind)
        seen = per.setdefault(key, [])
        if r.case not in timed or len(seen) >= MAX_LOOPS[r.kind] or (seen and not seen[-1].host_slow):
            return Checked(f"case {r.case}: an extra {r.kind.value} timing record (the harness's timer times "
                           "each case once, again only after a slow host): the timer was called by other code")
        wall = end.at - start.at
        if r.loop_s < WALL_SHARE * wall - WALL_SLACK_S:
            return Checked(f"case {r.case}: its timing contradicts the wall clock (the timer's {r.kind.value} loop "
                           f"took {r.loop_s:.3f} s by its clock, {wall:.3f} s by the parent's)")
        if r.kind is not LoopKind.BASELINE:
            if r.n_keep < 1 or len({c for c, _, _ in r.check}) < min(r.n_keep, r.calls):
                return Checked(f"case {r.case}: the timer kept fewer timed calls for the judge than it must")
            if any(not 0 <= s < job.timing.input_sets for _, s, _ in r.check):
                return Checked(f"case {r.case}: a timed call on an input set the harness does not have")
            checks = [ExpectedSample(name=timed_name(c), base_seed=set_seed(job, s), refresh_seed=seed)
                      for c, s, seed in r.check]
            out.expected.setdefault(r.case, []).extend(checks)
            if r.kind is LoopKind.GPU:
                out.graph_expected.setdefault(r.case, []).extend(checks)
        seen.append(r)
    for key, ends in per.items():
        best = min(ends, key=lambda e: (e.host_slow, e.median_us))
        out.timings[key] = Timing(**best.model_dump(include={"median_us", "p10_us", "p90_us", "samples",
                                                             "slow_host_calls", "host_slow", "after_us"}))
    # a pool's candidate job takes no baselines: its lane's baseline job did, checked alike (evaluator.py)
    wanted = [(m.case, LoopKind.BASELINE) for m in baselines] if job.time_baseline else []
    wanted += [(m.case, LoopKind.EAGER) for m in ran if m.case in timed and not m.untimed]
    wanted += [(m.case, LoopKind.GPU) for m in ran if m.case in timed and m.gpu is not None]
    missing = [k for k in wanted if k not in out.timings]
    if missing:
        case, kind = missing[0]
        return Checked(f"case {case}: no {kind.value} timing record from the harness's timer (the timing was "
                       "not taken by it)")
    # the reference: this process's baseline loops (before any candidate code), else the lane's baseline job's
    ref = ({c: t.after_us for (c, k), t in out.timings.items() if k is LoopKind.BASELINE} if job.time_baseline
           else {m.case: m.timing.after_us for m in baselines})
    out.moved = moved_work(out.timings, ref, job.device)
    return out


def moved_work(timings: dict[tuple[str, LoopKind], Timing], ref: dict[str, Optional[float]],
               device: Device) -> Optional[str]:
    """Why a timed loop's time between calls says work was moved out of its timed window, or None."""
    share, floor_us = AFTER_SLACK[device]
    for (case, kind), t in sorted(timings.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        base = ref.get(case)
        if kind is LoopKind.BASELINE or not base or t.after_us is None:
            continue
        allowed = base + max(share * (2 if t.host_slow else 1) * base, floor_us)
        if t.after_us > allowed and t.after_us - base > AFTER_OVER_MEDIAN[device] * t.median_us:
            return (f"case {case}: {t.after_us:.0f} us passed between its timed calls ({kind.value} loop), against "
                    f"{base:.0f} us of the harness's own work there in the baseline's loop: {MOVED}")
    return None


def with_timings(cases: list[CaseResult], timings: dict[tuple[str, LoopKind], Timing]) -> list[CaseResult]:
    """The case rows with the timer's figures in place of the candidate process's claims."""
    out = []
    for c in cases:
        upd: dict = {}
        base = timings.get((c.case, LoopKind.BASELINE))
        if base is not None:
            upd.update(baseline=base, baseline_us=base.median_us)
        if c.status is Status.PASSED and c.kind is not CaseKind.HIDDEN:
            eager, gpu = timings.get((c.case, LoopKind.EAGER)), timings.get((c.case, LoopKind.GPU))
            upd.update(time=eager, time_us=eager.median_us if eager else None, gpu_us=gpu.median_us if gpu else None)
        out.append(c.model_copy(update=upd))
    return out
