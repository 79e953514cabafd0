"""GPU smoke check of the native timer (worker/native/timer.c), torch and the stdlib only.

Builds the module with cc, then on the GPU: eager timing of a matmul against torch's own
events, a CUDA-graph replay loop with the `after` treatment, and a graph that does less
work than the eager call (its replays must leave poisoned outputs). Prints one JSON line.
Usage: python bench/native_timer_gpu.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "agent" / "worker" / "native" / "timer.c"


def load():
    so = Path(tempfile.mkdtemp()) / "_optagent_timer.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(SRC), "-o", str(so),
                    "-ldl"], check=True)
    loader = importlib.machinery.ExtensionFileLoader("_optagent_timer", str(so))
    m = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_optagent_timer", str(so),
                                                                               loader=loader))
    loader.exec_module(m)
    return m


def main() -> None:
    m = load()
    sr, sw = os.pipe()
    os.write(sw, b"s" * 32)
    os.close(sw)
    rr, rw = os.pipe()
    os.set_blocking(rr, False)
    m.init(sr, rw, True, 20, 200, 10, 0.3)
    torch.empty(1, device="cuda")
    m.cuda_setup()
    n = 4096
    a = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    c = [torch.empty_like(x) for x in a]
    sets = [[a[k], c[k]] for k in range(3)]

    def mm(x, out):
        torch.mm(x, x, out=out)

    after_calls = []

    def after(call, k, seed, keep, drop):
        if call >= 0:
            after_calls.append((call, k, keep, bool(torch.isnan(sets[k][1]).any())))
        sets[k][1].fill_(float("nan"))

    s = m.session("mm", 3, 4)
    eager = s.eager("eager", mm, sets, after)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for k in range(20):
        start.record()
        mm(*sets[k % 3])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    graphs = []
    for k in range(3):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            mm(*sets[k])
        graphs.append(g)
    for x in c:
        x.fill_(float("nan"))
    after_calls.clear()
    gpu = s.replay(lambda i: graphs[i % 3].replay(), after)
    replay_nan = any(nan for *_, nan in after_calls)
    # a graph of a quarter of the work: rows 0..n/4 only; the rest stays poisoned
    quarter = []
    for k in range(3):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.mm(a[k][: n // 4], a[k], out=c[k][: n // 4])
        quarter.append(g)
    for x in c:
        x.fill_(float("nan"))
    after_calls.clear()
    q = m.session("quarter", 3, 4).replay(lambda i: quarter[i % 3].replay(), after)
    quarter_nan = all(nan for *_, nan in after_calls)
    try:
        raw = os.read(rr, 1 << 20).decode()
    except BlockingIOError:
        raw = ""
    print(json.dumps({"eager_us": eager["median_us"], "torch_events_us": times[10], "gpu_us": gpu["median_us"],
                      "quarter_us": q["median_us"], "honest_replays_wrote_all": not replay_nan,
                      "quarter_replays_left_nan": quarter_nan, "records": len(raw.splitlines()),
                      "host_slow": eager["host_slow"], "check": gpu["check"]}))
    print(raw[-1500:], file=sys.stderr)


if __name__ == "__main__":
    main()
