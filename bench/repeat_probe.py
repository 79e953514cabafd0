"""Why one kernel's eager time moves between evaluations (issue 31: repeatability within 3%).

Starts PROCS fresh processes one after another per kernel; each loads the kernel and times every case as the
harness does (L2 flushed by a write, synchronised, a host-speed probe, the call up to a device-wide sync), CALLS
calls a case over three input sets, twice over the cases (two passes), and keeps every call's (probe, time).
Printed per case: each process's median over all calls and over the calls whose probe ran within SLACK of the
fastest probe seen anywhere (the timer's rule, worker/host_speed.py, with a machine-wide reference), and the
spread of those medians across processes; then how a call's time follows its probe. A benchmark, not a test.

    python3 bench/repeat_probe.py [--procs 5] [--calls 60] [PACKAGE:KERNEL ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["tests/fixtures/packages/add_rmsnorm:tests/fixtures/packages/add_rmsnorm/starter/naive-Triton.txt",
           "tests/fixtures/packages/silu_mul_fp8:tests/fixtures/packages/silu_mul_fp8/starter/naive-Triton.txt",
           "tasks/flashattn_task_package:tasks/flashattn_task_package/starter/decode_triton.py"]

# Two probes in C beside the harness's Python one: timer.c's (a register loop: the CPU's speed alone) and a pointer
# chase over 16 MiB (the memory system's: caches, TLB, page walks), to see which of them a call's time follows.
PROBES_C = r"""
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
double reg_probe(void) { volatile uint64_t acc = 0; double t0 = now_us();
    for (uint64_t i = 0; i < 10000; i++) acc += i * 2654435761u; return now_us() - t0; }
static uint32_t *ring; static uint32_t at;
void chase_init(uint32_t n) { ring = malloc(n * sizeof *ring); for (uint32_t i = 0; i < n; i++) ring[i] = i;
    srand(7); for (uint32_t i = n - 1; i > 0; i--) { uint32_t j = rand() % (i + 1), t = ring[i]; ring[i] = ring[j]; ring[j] = t; }
    uint32_t first = ring[0], prev = first; for (uint32_t i = 1; i < n; i++) { uint32_t c = ring[i]; ring[prev] = c; prev = c; }
    ring[prev] = first; at = first; }
double chase_probe(void) { double t0 = now_us(); uint32_t a = at; for (int i = 0; i < 200; i++) a = ring[a]; at = a;
    return now_us() - t0; }
"""

CHILD = r"""
import ctypes, importlib.util, json, shutil, subprocess, sys, tempfile, time
import torch
from optagent.messages import CaseSpec
from optagent.schema import CaseKind
from optagent.worker.harness import TaskRuntime
from optagent.worker.host_speed import probe_us
pkg, kernel, calls, dev = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
rt = TaskRuntime(pkg, dev)
d = tempfile.mkdtemp()
open(d + "/p.c", "w").write(sys.argv[6])
subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", d + "/p.so", d + "/p.c"], check=True)
lib = ctypes.CDLL(d + "/p.so")
lib.reg_probe.restype = lib.chase_probe.restype = ctypes.c_double
lib.chase_init(4 << 20)
src = d + "/cand.py"
shutil.copyfile(kernel, src)
spec = importlib.util.spec_from_file_location("cand", src)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
fn = mod.run_kernel
flush = torch.empty(256 << 20 if dev == "cuda" else 1 << 20, dtype=torch.uint8, device=dev)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
out = {}
cases = int(sys.argv[4])
for p in range(2):
    for i in range(1, cases + 1):
        case = CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i)
        sets = [rt.make_args(case, 1000 * i + k)[0] for k in range(3)]
        for k in range(10):
            fn(*sets[k % 3])
        sync()
        rows = []
        for k in range(calls):
            flush.zero_(); sync()
            chase = lib.chase_probe(); reg = lib.reg_probe(); pr = probe_us()  # the harness's own last, as there
            t0 = time.perf_counter(); fn(*sets[k % 3]); sync()
            rows.append((pr, reg, chase, (time.perf_counter() - t0) * 1e6))
        out.setdefault(str(i), []).extend(rows)
        del sets
print("JSON" + json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernels", nargs="*", default=DEFAULT)
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--cases", type=int, default=4, help="the first N contest cases")
    p.add_argument("--json", type=Path)
    p.add_argument("--device", default="cuda", help="cpu: only to try the script (the interpreter's times)")
    a = p.parse_args()
    from optagent.worker.host_speed import SLACK
    everything = {}
    for spec in a.kernels:
        pkg, kernel = spec.split(":")
        procs = []
        for _ in range(a.procs):
            run = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / pkg), str(ROOT / kernel), str(a.calls),
                                  str(a.cases), a.device, PROBES_C], capture_output=True, text=True, timeout=300)
            line = [x for x in run.stdout.splitlines() if x.startswith("JSON")]
            if not line:
                print(f"{kernel}: child failed: {run.stderr.strip().splitlines()[-3:]}")
                break
            procs.append(json.loads(line[0][4:]))
        if not procs:
            continue
        everything[spec] = procs
        names = ("python", "C reg", "C chase")
        fastest = [min(r[j] for proc in procs for rows in proc.values() for r in rows) for j in range(3)]
        print(f"\n{Path(kernel).name} ({pkg}): {len(procs)} processes; fastest probes (python, C register loop, "
              f"C pointer chase): {', '.join(f'{x:.2f}' for x in fastest)} us")
        print("per process, median probe: " + "; ".join(
            ", ".join(f"{statistics.median(r[j] for rows in proc.values() for r in rows):.1f}" for j in range(3))
            for proc in procs))

        def spread(xs: list[float]) -> float:
            good = [x for x in xs if x == x]
            return (max(good) - min(good)) / min(good) * 100 if good else float("nan")

        print(f"{'case':>5} {'per-process medians, all calls':>40} {'spread%':>8}   spread% of the calls each probe keeps "
              f"({', '.join(names)}; fewest kept)")
        for case in procs[0]:
            alls = [statistics.median(r[3] for r in proc[case]) for proc in procs]
            kept_spreads, fewest = [], []
            for j in range(3):
                meds, kept = [], []
                for proc in procs:
                    fast = [r[3] for r in proc[case] if r[j] <= SLACK * fastest[j]]
                    kept.append(len(fast))
                    meds.append(statistics.median(fast) if len(fast) >= 3 else float("nan"))
                kept_spreads.append(spread(meds))
                fewest.append(min(kept))
            print(f"{case:>5} {' '.join(f'{x:7.1f}' for x in alls):>40} {spread(alls):>8.1f}   "
                  + "  ".join(f"{sp:6.1f} ({k})" for sp, k in zip(kept_spreads, fewest)))
        # a call's time against each probe: the median call time of case 1 in each band of that probe
        rows = [r for proc in procs for r in proc[next(iter(procs[0]))]]
        bands = [(1.0, 1.1), (1.1, 1.3), (1.3, 1.6), (1.6, 2.2), (2.2, 99)]
        for j, name in enumerate(names):
            print(f"case 1, call time by {name} probe band (x fastest): " + ", ".join(
                f"{lo}-{hi}: {statistics.median(r[3] for r in rows if lo * fastest[j] <= r[j] < hi * fastest[j]):.1f} us "
                f"({sum(lo * fastest[j] <= r[j] < hi * fastest[j] for r in rows)})"
                for lo, hi in bands if any(lo * fastest[j] <= r[j] < hi * fastest[j] for r in rows)))
    if a.json:
        a.json.write_text(json.dumps(everything))


if __name__ == "__main__":
    main()
