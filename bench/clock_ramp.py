"""How long the GPU must idle before its first calls run slow, and for how many calls (issue 31: timing cost).

The timers (worker/native/timer.c, worker/bench.py) add WARM_S of warm-up calls to a loop that starts IDLE_S
after the last one ended, on the grounds that the clocks ramp up over tens of ms after an idle spell: 50 ms of
each of decode's 12 cases. This bench measures that ramp: a streaming kernel's steady time (graph-free events
around each call, synchronised), then after each idle gap the first calls' times against it, and the SM clock
NVML reads before and after the gap. A benchmark, not a test.

    python3 bench/clock_ramp.py [--mib 256] [--gaps 0.1,0.5,2,5] [--after-ms 800]
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


BINS_MS = (2, 10, 50, 100, 200, 400, 800)  # a call's start after the idle gap, in these bins (the timers' WARM_S: 50)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--gaps", default="0.1,0.5,2,5")
    p.add_argument("--after-ms", type=float, default=800.0, help="calls timed for this long after each gap")
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
    steady = statistics.median(call_us() for _ in range(400))
    mhz = clock() if clock else None
    print(f"steady: {steady:.1f} us a call ({a.mib} MiB in, {a.mib} MiB out), SM clock {mhz} MHz")
    edges = (0.0, *BINS_MS)
    print(f"{'idle s':>7} {'clock before/after':>19}  median call / steady, by its start after the gap (ms): "
          + " ".join(f"{lo:g}-{hi:g}" for lo, hi in zip(edges, edges[1:])))
    for gap in (float(g) for g in a.gaps.split(",")):
        seen: list[tuple[float, float]] = []  # (ms after the gap, x steady), three gaps of each length
        clocks = "-"
        for _ in range(3):
            for _ in range(50):
                call_us()
            before = clock() if clock else None
            time.sleep(gap)
            after = clock() if clock else None
            t0 = time.perf_counter()
            while (ms := (time.perf_counter() - t0) * 1e3) < a.after_ms:
                seen.append((ms, call_us() / steady))
            clocks = f"{before}/{after}" if clock else "-"
        bins = [[r for ms, r in seen if lo <= ms < hi] for lo, hi in zip(edges, edges[1:])]
        print(f"{gap:>7.2f} {clocks:>19}  " + " ".join(f"{statistics.median(b):.3f}" if b else "-" for b in bins))


if __name__ == "__main__":
    main()
