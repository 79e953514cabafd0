"""How long the GPU must idle before its first calls run slow, and for how many calls (issue 31: timing cost).

The timers (worker/native/timer.c, worker/bench.py) add WARM_S of warm-up calls to a loop that starts IDLE_S
after the last one ended, on the grounds that the clocks ramp up over tens of ms after an idle spell: 50 ms of
each of decode's 12 cases. This bench measures that ramp: a streaming kernel's steady time (graph-free events
around each call, synchronised), then after each idle gap the first calls' times against it, and the SM clock
NVML reads before and after the gap. A benchmark, not a test.

    python3 bench/clock_ramp.py [--mib 256] [--gaps 0.02,0.05,0.1,0.2,0.5,1,2,5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def sm_clock():
    """A reader of the SM clock in MHz (NVML), or None where NVML is missing."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--gaps", default="0.02,0.05,0.1,0.2,0.5,1,2,5")
    p.add_argument("--calls", type=int, default=12)
    a = p.parse_args()
    x = torch.randn(a.mib << 18, device="cuda")
    y = torch.empty_like(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    clock = sm_clock()

    def call_us() -> float:
        start.record()
        torch.mul(x, 1.0001, out=y)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    for _ in range(200):
        call_us()
    steady = statistics.median(call_us() for _ in range(200))
    mhz = clock() if clock else None
    print(f"steady: {steady:.1f} us a call ({a.mib} MiB in, {a.mib} MiB out), SM clock {mhz} MHz")
    print(f"{'idle s':>7} {'clock before/after':>19} {'call 1':>7} {'2-4':>7} {'5-8':>7} {'9-':>7}  (x steady)")
    for gap in (float(g) for g in a.gaps.split(",")):
        rows = []
        for _ in range(3):  # three gaps of each length: the median of each call's time
            for _ in range(50):
                call_us()
            before = clock() if clock else None
            time.sleep(gap)
            after = clock() if clock else None
            rows.append(([call_us() for _ in range(a.calls)], before, after))
        per_call = [statistics.median(r[0][i] for r in rows) / steady for i in range(a.calls)]
        clocks = f"{rows[-1][1]}/{rows[-1][2]}" if clock else "-"
        print(f"{gap:>7.2f} {clocks:>19} {per_call[0]:>7.2f} {statistics.mean(per_call[1:4]):>7.2f} "
              f"{statistics.mean(per_call[4:8]):>7.2f} {statistics.mean(per_call[8:]):>7.2f}")


if __name__ == "__main__":
    main()
