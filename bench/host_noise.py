"""How much host speed moves between fresh processes: the source of eager-time spread (issue 2).

Each variant starts PROCS fresh processes one after another; each process times, like the
evaluator's eager loop (L2 flushed by a write, synchronised, then timed up to a device-wide
sync), a tiny launch, a bare synchronise and a pure-Python loop, and prints its medians.
A benchmark, not a test.

    python3 bench/host_noise.py [PROCS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, os, statistics, sys, time
import torch
pin = sys.argv[1]
if pin != "-":
    os.sched_setaffinity(0, {int(pin)})
if sys.argv[2] == "nogc":
    gc.collect(); gc.disable()
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
x = torch.zeros(1024, device="cuda")
def med(f, n=300):
    s = []
    for _ in range(n):
        flush.zero_(); torch.cuda.synchronize()
        t0 = time.perf_counter(); f(); torch.cuda.synchronize(); s.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(s)
for _ in range(50):
    x.add_(1)
torch.cuda.synchronize()
py = []
for _ in range(300):
    t0 = time.perf_counter(); sum(range(20000)); py.append((time.perf_counter() - t0) * 1e6)
print(json.dumps({"sync": med(lambda: None), "launch": med(lambda: x.add_(1)),
                  "launch10": med(lambda: [x.add_(1) for _ in range(10)]), "py": statistics.median(py),
                  "cpu": os.sched_getaffinity(0).__len__()}))
"""


def main(procs: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    variants = {"unpinned": ("-", "gc"), f"pinned to cpu {cores[len(cores) // 2]}": (str(cores[len(cores) // 2]), "gc"),
                "unpinned, gc off": ("-", "nogc")}
    print(f"{len(cores)} cpus; per fresh process, median us: sync / 1 launch / 10 launches / python loop")
    for name, (pin, gc) in variants.items():
        rows = []
        for _ in range(procs):
            out = subprocess.run([sys.executable, "-c", CHILD, pin, gc], capture_output=True, text=True, timeout=120)
            if out.returncode:
                print(f"{name}: child failed: {out.stderr.strip().splitlines()[-1:]}")
                break
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if not rows:
            continue
        print(f"\n{name}")
        for r in rows:
            print(f"  {r['sync']:8.1f} {r['launch']:8.1f} {r['launch10']:8.1f} {r['py']:8.1f}")
        for key in ("sync", "launch", "launch10", "py"):
            v = [r[key] for r in rows]
            print(f"  {key:<9} max/min across processes {max(v) / min(v):.3f}  (median {statistics.median(v):.1f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
