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

CHILD = r"""
import importlib.util, json, shutil, sys, tempfile, time
import torch
from optagent.messages import CaseSpec
from optagent.schema import CaseKind
from optagent.worker.harness import TaskRuntime
from optagent.worker.host_speed import probe_us
pkg, kernel, calls, dev = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
rt = TaskRuntime(pkg, dev)
d = tempfile.mkdtemp()
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
            pr = probe_us()
            t0 = time.perf_counter(); fn(*sets[k % 3]); sync()
            rows.append((pr, (time.perf_counter() - t0) * 1e6))
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
                                  str(a.cases), a.device], capture_output=True, text=True, timeout=300)
            line = [x for x in run.stdout.splitlines() if x.startswith("JSON")]
            if not line:
                print(f"{kernel}: child failed: {run.stderr.strip().splitlines()[-3:]}")
                break
            procs.append(json.loads(line[0][4:]))
        if not procs:
            continue
        everything[spec] = procs
        fastest = min(pr for proc in procs for rows in proc.values() for pr, _ in rows)
        print(f"\n{Path(kernel).name} ({pkg}): {len(procs)} processes, fastest probe {fastest:.2f} us")
        print(f"{'case':>5} {'all calls: per-process medians':>44} {'spread%':>8} | {'fast-probe calls':>34} {'spread%':>8}"
              f" {'kept':>5}")
        for case in procs[0]:
            alls, fasts, kept = [], [], []
            for proc in procs:
                rows = proc[case]
                alls.append(statistics.median(t for _, t in rows))
                fast = [t for pr, t in rows if pr <= SLACK * fastest]
                kept.append(len(fast))
                fasts.append(statistics.median(fast) if len(fast) >= 3 else float("nan"))
            good = [f for f in fasts if f == f]
            sp = lambda xs: (max(xs) - min(xs)) / min(xs) * 100 if xs else float("nan")
            print(f"{case:>5} {' '.join(f'{x:7.1f}' for x in alls):>44} {sp(alls):>8.1f} | "
                  f"{' '.join(f'{x:6.1f}' for x in fasts):>34} {sp(good):>8.1f} {min(kept):>5}")
        # a call's time against its probe: the medians of the calls in each probe band, over all processes, case 1
        rows = [r for proc in procs for r in proc[next(iter(procs[0]))]]
        bands = [(1.0, 1.1), (1.1, 1.3), (1.3, 1.6), (1.6, 2.2), (2.2, 99)]
        print("case 1, call time by probe band (x fastest): " + ", ".join(
            f"{lo}-{hi}: {statistics.median(t for pr, t in rows if lo * fastest <= pr < hi * fastest):.1f} us "
            f"({sum(lo * fastest <= pr < hi * fastest for pr, _ in rows)})"
            for lo, hi in bands if any(lo * fastest <= pr < hi * fastest for pr, _ in rows)))
    if a.json:
        a.json.write_text(json.dumps(everything))


if __name__ == "__main__":
    main()
