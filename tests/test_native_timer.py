"""The native timer (worker/native/timer.c) on CPU: its build, its one-shot init, its records,
its budget rule and its callbacks; and the Python fallback where it cannot be built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optagent.evaluation import native_build
from optagent.evaluation.native_build import native_timer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def so(tmp_path_factory) -> Path:
    spec = native_timer(tmp_path_factory.mktemp("cache"))
    assert spec is not None, "the machine has a C compiler and Python's headers"
    return Path(spec.path)


def in_child(so: Path, body: str, *args) -> dict:
    """Run body in a fresh interpreter (init is once per process) with the module loaded as `m`,
    a secret pipe and a report pipe; it prints one JSON line, returned with the records it wrote."""
    code = textwrap.dedent('''
        import importlib.machinery, importlib.util, json, os, sys
        loader = importlib.machinery.ExtensionFileLoader("_optagent_timer", sys.argv[1])
        m = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_optagent_timer", sys.argv[1],
                                                                                   loader=loader))
        loader.exec_module(m)
        sr, sw = os.pipe(); os.write(sw, bytes(range(32))); os.close(sw)
        rr, rw = os.pipe()
        def records():
            os.close(rw)
            raw = b"".join(iter(lambda: os.read(rr, 65536), b""))
            return [line.split(b" ", 1) for line in raw.splitlines()]
    ''') + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code, str(so), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_init_is_one_shot_and_reads_the_secret_once(so):
    got = in_child(so, '''
        m.init(sr, rw, False, 2, 3, 1, 0.0)
        try:
            m.init(sr, rw, False, 2, 3, 1, 0.0)
            second = "accepted"
        except RuntimeError as e:
            second = str(e)
        try:
            os.fstat(sr)
            closed = False
        except OSError:
            closed = True
        print(json.dumps({"second": second, "secret_fd_closed": closed}))
    ''')
    assert got == {"second": "optagent timer: init() was already called", "secret_fd_closed": True}


def test_the_machine_usual_probe_lowers_the_process_own_once(so):
    # a process slow from its start must not call its own speed usual: the machine's record is its reference
    got = in_child(so, '''
        m.init(sr, rw, False, 2, 3, 1, 0.0)
        own = m.usual_probe_us()
        waited = m.wait_for_usual(5.0)  # at its own speed: usual, soon (a loaded host slows a probe now and then)
        m.machine_usual(own / 100)
        lowered = m.usual_probe_us()
        still_slow = m.wait_for_usual(0.05)  # 100x the machine's usual: never
        try:
            m.machine_usual(own * 1e-6)
            second = "accepted"
        except RuntimeError as e:
            second = str(e)
        print(json.dumps({"own": own, "lowered": lowered, "waited": waited, "still_slow": still_slow,
                          "second": second, "after": m.usual_probe_us()}))
    ''')
    assert got["waited"] is True and got["still_slow"] is False
    assert got["lowered"] == pytest.approx(got["own"] / 100) and got["after"] == got["lowered"]
    assert got["second"] == "optagent timer: the machine's usual probe is already set"


def test_a_slower_machine_record_leaves_the_process_own(so):
    got = in_child(so, '''
        m.init(sr, rw, False, 2, 3, 1, 0.0)
        own = m.usual_probe_us()
        m.machine_usual(own * 10)
        print(json.dumps({"own": own, "after": m.usual_probe_us()}))
    ''')
    assert got["after"] == got["own"]


def test_a_loop_writes_its_start_and_end_records_under_the_secret(so):
    got = in_child(so, '''
        m.init(sr, rw, False, 2, 3, 1, 0.0)
        seen = []
        r = m.session("smoke-1", 2, 4).eager("eager", lambda x: None, [[1], [2]],
                                             lambda *a: seen.append(list(a)))
        recs = records()
        print(json.dumps({"returned": r, "after": seen, "keys": [k.decode() for k, _ in recs],
                          "records": [json.loads(b) for _, b in recs]}))
    ''')
    start, end = got["records"]
    assert set(got["keys"]) == {bytes(range(32)).hex()}
    assert start == {"type": "start", "seq": 1, "case": "smoke-1", "kind": "eager"}
    assert end["type"] == "end" and end["seq"] == 2 and end["case"] == "smoke-1" and end["kind"] == "eager"
    assert end["calls"] == end["samples"] == 2 and end["host_slow"] is False and end["n_keep"] == 4
    assert 0 < end["p10_us"] <= end["median_us"] <= end["p90_us"] and end["loop_s"] > 0
    # one warm-up call (after gets a negative number, keep False), then two timed calls, both kept
    warm, first, second = got["after"]
    assert warm[0] == -1 and warm[1] == 0 and warm[3] is False
    assert [first[0], first[1], first[3]] == [1, 0, True] and [second[0], second[1], second[3]] == [2, 1, True]
    # each timed call is listed with the seed its inputs were drawn from: set 0 by the warm-up's redraw,
    # set 1 still holding its base inputs
    assert end["check"] == [[1, 0, warm[2]], [2, 1, None]]
    assert [tuple(c) for c in got["returned"]["check"]] == [tuple(c) for c in end["check"]]


@pytest.mark.parametrize("min_iters,max_iters,budget_s,calls", [(3, 10, 0.0, 3), (8, 20, 0.0, 5), (2, 7, 30.0, 7)])
def test_the_iteration_budget_rule(so, min_iters, max_iters, budget_s, calls):
    """At least min(5, min_iters) calls, more while the budget lasts, never over max_iters."""
    got = in_child(so, f'''
        m.init(sr, rw, False, {min_iters}, {max_iters}, 0, {budget_s})
        r = m.session("c", 1, 1).eager("eager", lambda: None, [[]], None)
        print(json.dumps({{"end": json.loads(records()[-1][1])}}))
    ''')
    assert got["end"]["calls"] == calls


def test_reservoir_keeps_n_and_each_sets_last_and_tells_after_what_to_drop(so):
    got = in_child(so, '''
        m.init(sr, rw, False, 40, 40, 0, 30.0)
        events = []
        s = m.session("c", 3, 4)
        r = s.eager("eager", lambda x: None, [[0], [1], [2]], lambda *a: events.append(list(a)))
        print(json.dumps({"check": r["check"], "after": events}))
    ''')
    held = set()
    seeds = {0: None, 1: None, 2: None}
    for call, k, seed, keep, drop in got["after"]:
        if keep:
            held.add((call, k, seeds[k]))
        held = {h for h in held if h[0] != drop}
        seeds[k] = seed
    check = {tuple(c) for c in got["check"]}
    assert len(held) == 4 and held <= check
    lasts = {k: max(e[0] for e in got["after"] if e[1] == k) for k in range(3)}
    assert {c for c, _, _ in check} == {c for c, _, _ in held} | set(lasts.values())  # nothing else
    assert len({seed for _, _, seed, _, _ in got["after"]}) == 40  # a fresh 40-bit seed per call


def test_the_build_is_rechecked_and_rebuilt_when_the_file_changes(tmp_path):
    spec = native_timer(tmp_path)
    assert spec is not None
    Path(spec.path).write_bytes(b"not the timer")
    again = native_timer(tmp_path)
    assert again is not None and again.sha256 == spec.sha256
    assert native_build._sha(Path(again.path)) == spec.sha256


def test_without_a_compiler_the_python_timer_is_used_and_said(tmp_path, monkeypatch, task_dir):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native_timer(tmp_path / "fresh") is None
    monkeypatch.delenv("CC")
    monkeypatch.setenv("OPTAGENT_TIMER", "python")
    assert native_timer(tmp_path / "fresh") is None
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.delenv("OPTAGENT_TIMER")
    env = {**os.environ, "OPTAGENT_CACHE": str(tmp_path / "cache"), "CC": "/nonexistent/cc"}
    starter = Path(task_dir) / "starter" / "decode_triton.py"
    done = subprocess.run([sys.executable, "-m", "optagent.cli.main", "eval", str(task_dir), str(starter),
                           "--device", "cpu", "--no-hidden", "--json"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "PASSED" and result["timer"] == "python"
    assert "timer: python (in-process; a candidate can rewrite it)" in done.stderr


def test_a_loop_stops_once_its_median_holds_still(so):
    """From min_iters on, a loop whose median moved by at most 0.3% over its last 10 calls ends (timer.c's
    adaptive stop): a steady 2 ms call stops after 20-40 calls, long before its 30 s budget; a call that
    keeps getting slower runs on to its budget."""
    got = in_child(so, '''
        import time
        m.init(sr, rw, False, 20, 1000, 0, 3.0)
        def steady():
            t = time.perf_counter()
            while time.perf_counter() - t < 0.002:
                pass
        n = [0]
        def slower():
            n[0] += 1
            t = time.perf_counter()
            while time.perf_counter() - t < 0.0005 * (1 + 0.05 * n[0]):
                pass
        m.session("a", 1, 1).eager("eager", steady, [[]], None)
        m.session("b", 1, 1).eager("eager", slower, [[]], None)
        ends = [json.loads(r[1]) for r in records()]
        print(json.dumps({"calls": [e["calls"] for e in ends if e.get("type") == "end"]}))
    ''')
    steady, slower = got["calls"]
    assert 20 <= steady <= 60, steady
    assert slower > 100, slower


def test_a_few_calls_deciles_stay_within_their_samples(so):
    """A CPU loop times 2-3 calls: the exclusive deciles extrapolated past the least (p10 = 1.6 x the least
    - 0.6 x the next), so a spread-out after-work read 0.001 us, and honest candidates compared with it were
    rejected for moved work. Both the native timer and the Python one keep p10 and p90 within the samples."""
    from optagent.worker.bench import stats

    got = in_child(so, '''
        import time
        m.init(sr, rw, False, 3, 3, 0, 0.0)
        pause = {1: 0.002, 2: 0.010, 3: 0.040}  # the timed calls' after-work; none after a warm-up call
        m.session("c", 1, 1).eager("eager", lambda: time.sleep(0.001), [[]], lambda *a: time.sleep(pause.get(a[0], 0)))
        print(json.dumps({"end": json.loads(records()[-1][1])}))
    ''')
    end = got["end"]
    assert end["calls"] == 3 and 2_000 <= end["after_us"] < 10_000, end  # not below its least interval
    assert end["p10_us"] >= 1_000 and end["p90_us"] >= end["median_us"]
    assert stats([10.0, 30.0, 50.0]) == {"median_us": 30.0, "p10_us": 10.0, "p90_us": 50.0, "samples": 3}
    assert stats([10.0, 30.0])["p10_us"] == 10.0
