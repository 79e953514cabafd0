"""The host's memory touched once by a pool on a GPU (evaluation/host_memory.py): bounded, real, reaped."""

from __future__ import annotations

import time

from optagent.evaluation import host_memory


def test_the_touch_is_bounded_by_a_quarter_of_the_available_memory(monkeypatch):
    monkeypatch.setattr(host_memory, "available_gib", lambda: 20.0)
    assert host_memory.gib_to_touch(16) == 5
    assert host_memory.gib_to_touch(3) == 3
    assert host_memory.gib_to_touch(0) == 0
    monkeypatch.setattr(host_memory, "available_gib", lambda: 0.0)  # no /proc/meminfo: nothing touched
    assert host_memory.gib_to_touch(16) == 0 and host_memory.touch_in_background(16) is None


def test_the_touch_writes_its_gib_and_ends():
    assert host_memory.available_gib() > 4, "the test machine has memory to spare"
    t0 = time.monotonic()
    proc = host_memory.touch_in_background(1)
    assert proc is not None and proc.wait(timeout=60) == 0
    assert time.monotonic() - t0 < 60


def test_a_touch_still_running_is_stopped_and_reaped(monkeypatch):
    monkeypatch.setattr(host_memory, "available_gib", lambda: 400.0)
    proc = host_memory.touch_in_background(64)  # minutes of writing: stopped long before
    assert proc is not None and proc.poll() is None
    host_memory.finish(proc)
    assert proc.returncode is not None and proc.returncode < 0


def test_a_lane_on_a_gpu_times_nothing_before_the_touch_ends(monkeypatch):
    from optagent.evaluation.lanes import Lane
    from optagent.schema import Device

    monkeypatch.setattr(host_memory, "available_gib", lambda: 20.0)
    monkeypatch.setattr(host_memory, "_touches", [])  # this process has touched nothing yet
    lane, other, cpu_lane = Lane(0, "cuda:0"), Lane(1, "cuda:0"), Lane(2, None)
    proc = host_memory.touch_before_timing([lane], 1, Device.CUDA)
    assert proc is not None and proc.poll() is None
    assert host_memory.touch_before_timing([other], 1, Device.CUDA) is proc  # a second pool: the same touch
    assert lane.acquire("timed") and proc.returncode == 0  # granted once the touch has ended
    assert lane.settled_s > 0
    lane.release("timed")
    assert host_memory.touch_before_timing([Lane(3, "cuda:0")], 1, Device.CUDA) is None  # done: once a process
    assert host_memory.touch_before_timing([cpu_lane], 1, Device.CPU) is None and cpu_lane.settle is None
