"""Whether fresh processes run Python slow because their memory is new to the machine (issue 31, repeatability).

On the lent GPU machines a pure-Python loop ran at its usual speed in most fresh processes and at half of it in
others (docs/gpu.md, bench/host_noise.py), pinned or not. One explanation: the machine is a microVM whose RAM is
backed by the host as it is first touched, so a process whose pages are new pays for it. This bench starts PROCS
fresh processes, each timing the loop (the median of 300 runs), then touches GIB of memory once in this process and
frees it, then starts PROCS fresh processes again. Were the slow processes the new memory's, the second set runs at
the usual speed. A benchmark, not a test.

    python3 bench/host_memory.py [--procs 8] [--gib 32]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHILD = r"""
import statistics, time
big = bytearray(64 << 20)  # the interpreter's own heap, and a fresh 64 MiB
big[::4096] = b"\x01" * (len(big) // 4096)
s = []
for _ in range(300):
    t0 = time.perf_counter(); sum(range(20000)); s.append((time.perf_counter() - t0) * 1e6)
print(statistics.median(s))
"""


def fresh(procs: int) -> list[float]:
    out = []
    for _ in range(procs):
        run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
        out.append(float(run.stdout.strip() or "nan"))
    return out


def touch(gib: int) -> float:
    t0 = time.perf_counter()
    chunks = []
    for _ in range(gib):
        b = bytearray(1 << 30)  # mapped, not yet backed
        b[::4096] = b"\x01" * (1 << 18)  # a write to each page: backed now
        chunks.append(b)
    del chunks
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--gib", type=int, default=32)
    a = p.parse_args()
    first = fresh(a.procs)
    print("fresh processes, python loop median us: " + " ".join(f"{x:.0f}" for x in first))
    took = touch(a.gib)
    print(f"touched {a.gib} GiB in {took:.1f} s ({a.gib / took:.1f} GiB/s)")
    second = fresh(a.procs)
    print("fresh processes after:              " + " ".join(f"{x:.0f}" for x in second))
    for name, xs in (("before", first), ("after", second)):
        print(f"{name}: median {statistics.median(xs):.0f} us, slowest / fastest {max(xs) / min(xs):.2f}")


if __name__ == "__main__":
    main()
