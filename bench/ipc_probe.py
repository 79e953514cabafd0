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
- the launcher also times the same call with CUDA events, as the harness's timer does, and tells that
  time after the window: each request's window less its own call's events is the overhead a referee
  would have to subtract, and its spread is the referee's resolution;
- a primed request (pe, pk) first asks the launcher, untimed, for a trivial op in its own context after
  the referee's redraw and flush: whether the GPU's switch between the two contexts can be kept out of
  the timed window.

Printed: whether IPC opened under the isolation, and per kind the window, the events and the window
less the events (median and 10-90%), and how many outputs were wrong.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
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
scratch = torch.empty(1, device="cuda")
os.write(w, b"R\n")
while True:
    q = os.read(r, 1)
    if not q or q == b"q":
        break
    if q == b"p":  # a prime: this context's switch-in, paid before the timed request
        scratch.zero_()
        torch.cuda.synchronize()
        os.write(w, b"d")
        continue
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    if q == b"k":
        torch.mul(x, 2, out=y).add_(1)
    b.record()
    torch.cuda.synchronize()
    os.write(w, b"d")
    os.write(w, f"{a.elapsed_time(b) * 1e3:.2f}\n".encode())  # after the window: the call's own events
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
    # e: empty, k: kernel, each right after the referee's redraw and flush; pe, pk: the same after a prime
    # (the launcher's context switched in, untimed, after that redraw and flush)
    kinds = ["e", "k", "pe", "pk"] * (a.requests // 4)
    random.shuffle(kinds)
    rtt: dict[str, list[float]] = {k: [] for k in ("e", "k", "pe", "pk")}
    over: dict[str, list[float]] = {k: [] for k in rtt}  # window less the call's own events
    events: dict[str, list[float]] = {k: [] for k in rtt}
    wrong = 0
    for kind in kinds:
        x.copy_(base.roll(random.randrange(1, n)))  # the referee's redraw, in its own context
        flush.zero_()
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        if kind.startswith("p"):
            os.write(q_w, b"p")
            assert reader.read(1) == b"d"
        t0 = time.perf_counter()
        os.write(q_w, kind[-1].encode())
        assert reader.read(1) == b"d"
        window = (time.perf_counter() - t0) * 1e6
        ev = float(line())
        rtt[kind].append(window)
        events[kind].append(ev)
        over[kind].append(window - ev)
        if kind.endswith("k") and not torch.equal(y, x * 2 + 1):
            wrong += 1
    os.write(q_w, b"q")
    child.wait(60)
    print(f"{'elements':>10} {'kind':>4} {'window us (10-90%)':>24} {'events us (10-90%)':>24} "
          f"{'window-events (10-90%)':>26} wrong")
    for kind in rtt:
        bad = f"{wrong}/{len(rtt['k']) + len(rtt['pk'])}" if kind == "pk" else ""
        print(f"{n:>10} {kind:>4} {spread(rtt[kind]):>24} {spread(events[kind]):>24} {spread(over[kind]):>26} {bad}",
              flush=True)

if __name__ == "__main__":
    main()
