"""Where a Triton candidate's first calls spend their time: its kernels' compiles, their launchers' builds, their
loads (issue 31: the `splitkv_gqa` strategy's correctness phase took 9.8 s of its 12.6 on an H100).

    python bench/triton_compile_cost.py [PACKAGE_DIR] [KERNEL] [--modes serial,dry4,dry8] [--cases 1,2,...]

Each mode runs in a fresh process with an empty Triton cache, prepared as a warm worker is (worker/__main__.py
warm_up: the driver's helper module built, Triton's key hashed), then each case's first call (a fresh copy of the
kernel's module per case, as the harness loads it) and a device sync:
- serial: as the harness runs today; the split comes from hooks around Triton's compile, its launcher build
  (gcc) and the binary's load;
- dryN: first a dry pass over the cases (every Triton launch caught before its compile, recorded, not run), then
  the recorded specialisations compiled on N threads (their launchers built there too), then the same first calls.
Prints one line a mode: wall s of all first calls (the dry pass and the parallel compile included), and the split.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(owner, name: str, spent: dict, counts: dict, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0
            counts[label] += 1
    setattr(owner, name, wrapper)


def one_mode(package: Path, kernel: Path, mode: str, cases: list[int]) -> dict:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcc-")
    import torch
    import triton
    from concurrent.futures import ThreadPoolExecutor
    from triton import knobs
    from triton.runtime.cache import triton_key
    import triton.backends.nvidia.driver as nvdriver

    from optagent.messages import CaseSpec
    from optagent.schema import CaseKind, Device, Language
    from optagent.worker.backends import backend_for
    from optagent.worker.harness import TaskRuntime

    torch.zeros(1, device="cuda")
    triton.runtime.driver.active.get_current_device()
    triton_key()
    spent: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    import triton.compiler as tc
    _timed(tc, "compile", spent, counts, "compile")
    _timed(nvdriver, "compile_module_from_src", spent, counts, "launcher")
    _timed(triton.runtime.driver.active.utils, "load_binary", spent, counts, "load")
    rt = TaskRuntime(str(package), Device.CUDA.value)
    backend = backend_for(Language.TRITON, Device.CUDA, None, 120.0)
    scratch = Path(tempfile.mkdtemp(prefix="tcc-scratch-"))
    backend.prepare(kernel, scratch)
    made = []
    for index in cases:
        case = CaseSpec(label=str(index), kind=CaseKind.CONTEST, index=index)
        made.append(rt.make_args(case, 1)[0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    if mode.startswith("dry"):
        seen: dict = {}

        def hook(*, key, fn, compile, **_):
            seen.setdefault((id(fn.jit_function), str(key)), (fn.jit_function, compile["specialization_data"]))
            return True  # no compile, no launch
        knobs.runtime.jit_cache_hook = hook
        for i, args in enumerate(made):
            try:
                backend.load_fresh(f"dry{i}")(*args)
            except Exception as e:  # a launcher that needed a kernel's result: its real run compiles what is left
                print(f"  dry pass, case {cases[i]}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        knobs.runtime.jit_cache_hook = None
        dry_s = time.perf_counter() - start

        def build(item):
            jit_fn, data = item
            kernel = jit_fn.preload(data)
            kernel._init_handles()  # its launcher built and its binary loaded here too
        with ThreadPoolExecutor(int(mode[3:])) as pool:
            list(pool.map(build, seen.values()))
        spent["dry pass"], counts["dry pass"] = dry_s, len(seen)
        spent["parallel"] = time.perf_counter() - start - dry_s
    for i, args in enumerate(made):
        backend.load_fresh(f"case{i}")(*args)
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"mode": mode, "wall_s": wall, "spent": dict(spent), "counts": dict(counts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("package", nargs="?", default=str(ROOT / "tasks" / "flashattn_task_package"))
    p.add_argument("kernel", nargs="?",
                   default=str(ROOT / "agent" / "search" / "strategies" / "paged_decode" / "splitkv_gqa.py"))
    p.add_argument("--modes", default="serial,dry4,dry8")
    p.add_argument("--cases", default="")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    from optagent.task import load_task
    from optagent.worker.harness import TaskRuntime
    from optagent.schema import Device

    package = load_task(Path(a.package)).root
    cases = [int(c) for c in a.cases.split(",") if c] or list(range(1, TaskRuntime(str(package), Device.CUDA.value)
                                                                   .num_cases() + 1))
    if a.one:
        print(json.dumps(one_mode(package, Path(a.kernel), a.one, cases)))
        return
    print(f"{Path(a.kernel).name} on {package.name}, cases {cases[0]}-{cases[-1]}: first calls, fresh Triton cache")
    for mode in a.modes.split(","):
        out = subprocess.run([sys.executable, __file__, a.package, a.kernel, "--one", mode, "--cases",
                              ",".join(map(str, cases))], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{mode}: failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        split = ", ".join(f"{k} {v:.2f} s ({r['counts'].get(k, 0)})" for k, v in r["spent"].items())
        print(f"{mode:>7}: {r['wall_s']:.2f} s   {split}")
        if out.stderr.strip():
            print("\n".join("    " + line for line in out.stderr.strip().splitlines()[-6:]))


if __name__ == "__main__":
    main()
