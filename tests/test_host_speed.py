"""The eager estimator's host-speed conditioning: which calls count, and the machine record."""

from __future__ import annotations

import json

from optagent.enums import TimerKind
from optagent.worker import host_speed
from optagent.worker.bench import Timer


def test_calls_made_while_the_host_ran_slow_are_left_out():
    samples = [100.0, 101.0, 205.0, 99.0, 210.0, 102.0]
    probes = [10.0, 10.2, 20.5, 9.9, 21.0, 10.1]
    kept, slow = host_speed.at_usual_speed(samples, probes, usual=10.0)
    assert kept == [100.0, 101.0, 99.0, 102.0] and not slow


def test_a_host_slow_throughout_keeps_every_call_and_says_so():
    samples = [200.0, 205.0, 210.0, 199.0]
    kept, slow = host_speed.at_usual_speed(samples, [20.0, 21.0, 20.5, 20.2], usual=10.0)
    assert kept == samples and slow


def test_the_loop_own_fastest_probe_lowers_a_stale_record():
    # a record from a slower machine must not leave every call counted as "usual"
    kept, slow = host_speed.at_usual_speed([100.0, 200.0, 101.0, 99.0], [10.0, 20.0, 10.1, 10.0], usual=30.0)
    assert kept == [100.0, 101.0, 99.0] and not slow


def test_the_machine_record_keeps_the_fastest_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    assert host_speed.usual_probe_us(12.0) == 12.0
    assert host_speed.usual_probe_us(20.0) == 12.0  # a slow process does not raise the record
    assert host_speed.usual_probe_us(9.0) == 9.0
    record = json.loads((tmp_path / "host_probe.json").read_text())
    assert list(record.values()) == [9.0]


def test_each_timer_probe_has_its_own_record(tmp_path, monkeypatch):
    # the native timer's probe is a C loop, not this module's: its record must not lower the Python one's
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    assert host_speed.usual_probe_us(12.0) == 12.0
    assert host_speed.usual_probe_us(3.0, TimerKind.NATIVE) == 3.0
    assert host_speed.usual_probe_us(20.0) == 12.0
    assert host_speed.usual_probe_us(5.0, TimerKind.NATIVE) == 3.0
    assert sorted(json.loads((tmp_path / "host_probe.json").read_text()).values()) == [3.0, 12.0]


def test_eager_timing_reports_how_many_calls_ran_on_a_slow_host(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    timer = Timer("cpu", min_iters=20, max_iters=20, budget_s=10.0, warmup=1)
    slow_every = iter(range(10**6))

    def probe() -> float:  # every fourth call's probe runs at half speed
        return 20.0 if next(slow_every) % 4 == 3 else 10.0

    monkeypatch.setattr(host_speed, "probe_us", probe)
    timer._usual_probe = 10.0
    timer.host_conditioned = True  # as on a GPU
    t = timer.eager(lambda: sum(range(1000)), [[]])
    assert t["slow_host_calls"] == 5 and t["samples"] == 15 and not t["host_slow"]


def test_a_timing_on_a_slow_host_is_taken_again_once_the_host_is_back(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    timer = Timer("cpu", min_iters=10, max_iters=10, budget_s=10.0, warmup=1)
    timer._usual_probe = 10.0
    timer.host_conditioned = True  # as on a GPU
    probes = iter([20.0] * 10 + [10.0] * 1000)  # the first loop's probes all slow, then usual
    monkeypatch.setattr(host_speed, "probe_us", lambda: next(probes))
    calls = []
    t = timer.eager(lambda: calls.append(1), [[]])
    assert not t["host_slow"] and t["slow_host_calls"] == 0
    assert len(calls) == 2 * (1 + 10)  # warm-up and timed calls, twice


def test_cpu_interpreter_timings_are_not_conditioned_or_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    timer = Timer("cpu", min_iters=3, max_iters=3, budget_s=10.0, warmup=1)
    timer._usual_probe = 10.0
    monkeypatch.setattr(host_speed, "probe_us", lambda: 50.0)  # a slow host throughout
    calls = []
    t = timer.eager(lambda: calls.append(1), [[]])
    assert len(calls) == 1 + 3 and not t["host_slow"] and t["samples"] == 3


def test_a_wait_that_finds_the_host_still_slow_is_the_process_last(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    timer = Timer("cpu", min_iters=4, max_iters=4, budget_s=10.0, warmup=1)
    timer._usual_probe = 10.0
    timer.host_conditioned = True  # as on a GPU
    monkeypatch.setattr(host_speed, "probe_us", lambda: 20.0)  # a slow stretch, longer than any wait
    waits = []

    def wait(usual: float, max_s: float) -> bool:
        waits.append(max_s)
        return False

    monkeypatch.setattr(host_speed, "wait_for_usual", wait)
    calls = []
    for _ in range(3):  # three cases
        t = timer.eager(lambda: calls.append(1), [[]])
        assert t["host_slow"] and t["samples"] == 4
    assert waits == [1.0]  # one wait, not one a case up to the 4 s in all
    assert len(calls) == 3 * (1 + 4)  # and no loop was taken again


def test_the_native_timer_too_waits_no_more_once_a_wait_found_the_host_still_slow():
    from types import SimpleNamespace

    from optagent.schema import Device
    from optagent.timer_records import LoopKind
    from optagent.worker.timers import NativeTimer

    waits, loops = [], []

    class Session:
        def eager(self, kind, fn, sets, after):
            loops.append(kind)
            return {"host_slow": True, "median_us": 5.0, "check": []}

    module = SimpleNamespace(session=lambda label, n_sets, n_keep: Session(),
                             wait_for_usual=lambda max_s: waits.append(max_s) or False)
    timer = NativeTimer(module, SimpleNamespace(device=Device.CPU))
    timer.device = Device.CUDA  # its waits are a GPU's (no CUDA set-up here)
    for label in ("1", "2", "3"):
        assert timer.eager(label, LoopKind.EAGER, lambda: None, [[]])["host_slow"]
    assert waits == [1.0] and loops == ["eager"] * 3
