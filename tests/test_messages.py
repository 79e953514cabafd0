"""The result pipe's wire: typed messages out of the worker, and only the harness's lines back in."""

from __future__ import annotations

import json
import os

import pytest

from optagent.evaluation.sandbox import WorkerRun
from optagent.messages import (Baseline, CaseFailed, CaseRan, CaseSpec, CaseStart, Channel, Compiled, Done, Hello,
                               Phase, PhaseStarted, Probed, ProbedCase, Sample, Verdict, WorkerError, parse_line,
                               parse_messages)
from optagent.progress import PipeRelay, Progress
from optagent.schema import CaseKind, Status, Timing

NONCE = "a" * 32
T = Timing(median_us=12.5, p10_us=11.0, p90_us=14.0, samples=20)


def through_a_pipe(*messages) -> bytes:
    rfd, wfd = os.pipe()
    chan = Channel(wfd, NONCE)
    for m in messages:
        chan.send(m)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        return r.read()


def test_messages_come_back_as_the_models_sent_with_the_nonce_stamped():
    sent = [Hello(baseline_label="stand-in", device_name="cpu"),
            Baseline(case="1", timing=T, sizes="2x16"),
            Compiled(status=Status.PASSED),
            PhaseStarted(phase=Phase.TIMING, case="1"),
            CaseRan(case="1", samples=[Sample(name="given", file="/s/1.pt", sha256="f" * 64)], load_ms=2.5, timing=T),
            CaseFailed(case="2", status=Status.UNSUPPORTED, reason="needs a GPU"),
            Verdict(case="1", status=Status.PASSED, rel_err=float("inf"), floor_us=3.0),
            Probed(cases=[ProbedCase(index=1, sizes=[[2, 16]], warmup=1, iters=2, elements=32)], outputs=[2],
                   baseline_label="b", probed_case=1),
            WorkerError(error="ValueError: x", traceback="tb"), Done()]
    got, foreign = parse_messages(through_a_pipe(*sent), NONCE)
    assert foreign == 0
    assert got == [m.model_copy(update={"nonce": NONCE}) for m in sent]
    assert got[1].timing == T and got[2].status is Status.PASSED and got[3].phase is Phase.TIMING
    assert got[6].rel_err == float("inf")  # as json.dumps wrote it before: not turned into null


def test_typed_accessors_pick_messages_by_kind():
    run = WorkerRun([CaseStart(case="1"), CaseRan(case="1", samples=[], load_ms=1.0),
                     CaseFailed(case="2", status=Status.INCORRECT, reason="r"), Done()])
    assert run.first(CaseRan).case == "1" and run.first(Hello) is None
    assert [m.case for m in run.all((CaseRan, CaseFailed))] == ["1", "2"] and run.all(Verdict) == []


GOOD = {"nonce": NONCE, "type": "case_start", "case": "1"}


@pytest.mark.parametrize("line", [
    b"PASSED speedup 1000x",  # not JSON
    json.dumps({"type": "case", "status": "RAN", "case": "smoke-1"}).encode(),  # no nonce (the FAKE of test_evaluator)
    json.dumps({**GOOD, "nonce": "b" * 32}).encode(),  # another run's nonce
    json.dumps({**GOOD, "type": "case_done"}).encode(),  # no such message
    json.dumps({**GOOD, "speedup": 1000}).encode(),  # a field the harness never sends
    json.dumps({"nonce": NONCE, "type": "case_failed", "case": "1", "status": "PASSED", "reason": "x"}).encode(),
    json.dumps({"nonce": NONCE, "type": "compile", "status": "OK"}).encode(),  # the old status, not a Status
    json.dumps({"nonce": NONCE, "type": "compile", "status": "COMPILE_ERROR"}).encode(),  # a failure needs a reason
    json.dumps([GOOD]).encode(),
    b"\xff\xfe{}",
])
def test_a_line_that_is_not_exactly_a_harness_message_is_foreign(line):
    assert parse_line(json.dumps(GOOD).encode(), NONCE) == CaseStart(nonce=NONCE, case="1")
    assert parse_line(line, NONCE) is None
    got, foreign = parse_messages(through_a_pipe(Done()) + line + b"\n" + json.dumps(GOOD).encode() + b"\n", NONCE)
    assert foreign == 1 and [type(m) for m in got] == [Done, CaseStart]


def test_the_relay_turns_typed_messages_into_progress():
    events: list[Progress] = []
    cases = [CaseSpec(label="smoke-1", kind=CaseKind.SMOKE), CaseSpec(label="hidden-1", kind=CaseKind.HIDDEN)]
    relay = PipeRelay(events.append, cases)
    for m in (Hello(baseline_label="b", device_name="cpu"), PhaseStarted(phase=Phase.BASELINE, case="smoke-1"),
              CaseStart(case="hidden-1"), PhaseStarted(phase=Phase.COMPILING), CaseStart(case="nowhere")):
        relay(m)
    assert [(e.phase, e.case, e.index, e.total) for e in events] == [
        (Phase.BASELINE, "smoke-1", 1, 1), (Phase.CASE, "hidden-1", 2, 2), (Phase.COMPILING, None, None, None),
        (Phase.CASE, None, None, None)]
