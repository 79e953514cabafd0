"""Can a referee outside the candidate's process hand it inputs and read its outputs on the GPU (issue 31)?

    python bench/ipc_probe.py [--isolation bwrap|none] [--requests N] [--elements N]

The direction issue 31 gives: a trusted referee holds the case's inputs in device memory it allocated,
redraws them itself between calls, and the candidate's process (a launcher) reaches them through CUDA
IPC, runs the kernel when asked, synchronises and says done; the referee times each request by its own
clock and reads the outputs from the same memory. This measures whether that works where candidates
run (under bubblewrap's namespaces, as evaluation/isolation.py wraps a worker) and what it costs:

- the referee (this process) allocates an input and an output with the driver (cuMemAlloc), exports
  IPC handles, and starts the launcher under the isolation;
- per request, at random: an empty request (the launcher only synchronises) or a kernel request
  (out = in * 2 + 1 over N elements); before each, the referee redraws the input in its own context
  (a roll by a random amount), flushes L2 (a 256 MiB memset) and synchronises, then writes the request
  and times it to the launcher's "done";
- after each kernel request the referee checks the output against its own computation (an output
  the launcher left unwritten, or wrote late, would differ);
- the launcher also times the same call with CUDA events, as the harness's timer does.

Printed: whether IPC opened under the isolation, the round trip of empty and kernel requests (median
and 10-90%), their difference against the events' median, and how many outputs were wrong.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from referee_rtt import spread  # bench/ is the script's own folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]

LAUNCHER = r'''
import ctypes, os, statistics, sys, torch
r, w, handles, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
torch.empty(1, device="cuda")  # the primary context, current on this thread
cu = ctypes.CDLL("libcuda.so.1")

class View:  # a raw device pointer as a tensor (the CUDA array interface)
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}

class Handle(ctypes.Structure):  # CUipcMemHandle, passed by value
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]

open_handle = getattr(cu, "cuIpcOpenMemHandle_v2", None) or cu.cuIpcOpenMemHandle
open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
tensors = []
for h in handles:
    ptr = ctypes.c_uint64()
    rc = open_handle(ctypes.byref(ptr), Handle((ctypes.c_ubyte * 64).from_buffer_copy(bytes.fromhex(h))), 1)
    if rc != 0:
        os.write(w, f"E cuIpcOpenMemHandle failed: {rc}\n".encode())
        sys.exit(1)
    tensors.append(torch.as_tensor(View(ptr.value, n), device="cuda"))
x, y = tensors
os.write(w, b"R\n")
while True:
    q = os.read(r, 1)
    if not q or q == b"q":
        break
    if q == b"k":
        torch.mul(x, 2, out=y).add_(1)
    torch.cuda.synchronize()
    os.write(w, b"d")
times = []
for _ in range(200):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); torch.mul(x, 2, out=y).add_(1); b.record(); b.synchronize()
    times.append(a.elapsed_time(b) * 1e3)
os.write(w, f"T {statistics.median(times)}\n".encode())
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isolation", choices=["bwrap", "none"], default="bwrap")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--elements", type=int, default=1 << 20)
    a = p.parse_args()
    import torch

    from optagent.evaluation import isolation
    from optagent.schema import Mechanism

    torch.empty(1, device="cuda")
    cu = ctypes.CDLL("libcuda.so.1")
    n = a.elements

    class View:
        def __init__(self, ptr: int):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}

    ptrs, handles = [], []
    for _ in range(2):
        ptr = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4 * n)) == 0
        handle = (ctypes.c_ubyte * 64)()
        rc = cu.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(ptr.value))
        assert rc == 0, f"cuIpcGetMemHandle: {rc}"
        ptrs.append(ptr.value)
        handles.append(bytes(handle).hex())
    x, y = (torch.as_tensor(View(ptr), device="cuda") for ptr in ptrs)
    base = torch.randn(n, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    q_r, q_w = os.pipe()
    a_r, a_w = os.pipe()
    argv = [sys.executable, "-c", LAUNCHER, str(q_r), str(a_w), ",".join(handles), str(n)]
    scratch = Path(tempfile.mkdtemp(prefix="ipc-probe-"))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if a.isolation == "bwrap":
        argv = isolation.wrap(argv, env, Mechanism.BWRAP, scratch, "cuda", str(ROOT), [], [])
    child = subprocess.Popen(argv, pass_fds=(q_r, a_w), env=env)
    os.close(q_r)
    os.close(a_w)
    reader = os.fdopen(a_r, "rb", buffering=0)

    def line() -> str:
        out = b""
        while not out.endswith(b"\n"):
            c = reader.read(1)
            if not c:
                return "E launcher ended"
            out += c
        return out.decode().strip()

    hello = line()
    print(f"isolation {a.isolation}: launcher says {hello!r}", flush=True)
    if hello != "R":
        child.wait(30)
        return
    kinds = [b"e", b"k"] * (a.requests // 2)
    random.shuffle(kinds)
    rtt: dict[bytes, list[float]] = {b"e": [], b"k": []}
    wrong = 0
    for kind in kinds:
        x.copy_(base.roll(random.randrange(1, n)))  # the referee's redraw, in its own context
        flush.zero_()
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        os.write(q_w, kind)
        assert reader.read(1) == b"d"
        rtt[kind].append((time.perf_counter() - t0) * 1e6)
        if kind == b"k" and not torch.equal(y, x * 2 + 1):
            wrong += 1
    os.write(q_w, b"q")
    events = line()
    child.wait(60)
    est = statistics.median(rtt[b"k"]) - statistics.median(rtt[b"e"])
    print(f"{'elements':>10} {'empty us (10-90%)':>24} {'kernel us (10-90%)':>24} {'kernel-empty':>12} {'events':>10} wrong")
    print(f"{n:>10} {spread(rtt[b'e']):>24} {spread(rtt[b'k']):>24} {est:12.1f} {events.split()[-1]:>10} "
          f"{wrong}/{len(rtt[b'k'])}", flush=True)


if __name__ == "__main__":
    main()
