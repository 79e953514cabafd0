"""What a CUDA candidate's library costs to load, a fresh copy a case as the harness loads it (issue 31).

    python bench/cuda_load.py [--loads N]

The harness loads a fresh copy of the candidate's .so for every case it checks and again for every case it times
(worker/backends/cuda.py load_fresh: dlopen keys on the path, so each copy has fresh static state). nvcc links the
CUDA runtime statically by default, so each copy carries a runtime of its own that initialises on its first call.
This builds one small kernel each way (-cudart static, -cudart shared) and prints, per copy: the copy and dlopen,
the first call (its runtime's start and the module's load) and a second call, each up to a device sync; medians.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

SOURCE = r"""
__global__ void add_one(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
extern "C" void run_kernel(float *x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
"""


def build(work: Path, runtime: str) -> Path:
    src, out = work / "k.cu", work / f"k_{runtime}.so"
    src.write_text(SOURCE)
    major, minor = torch.cuda.get_device_capability()
    subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", f"-arch=sm_{major}{minor}", "-cudart", runtime,
                    "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loads", type=int, default=12)
    a = p.parse_args()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"{'runtime':<8} {'copy+dlopen ms':>15} {'first call ms':>14} {'second call ms':>15}  (medians of {a.loads})")
        for runtime in ("static", "shared"):
            lib_path = build(work, runtime)
            opened, first, second = [], [], []
            for i in range(a.loads):
                fresh = work / f"copy_{runtime}_{i}.so"
                t0 = time.perf_counter()
                shutil.copyfile(lib_path, fresh)
                lib = ctypes.CDLL(str(fresh), mode=ctypes.RTLD_LOCAL)
                opened.append((time.perf_counter() - t0) * 1e3)
                fn = lib.run_kernel
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], None
                first.append(timed(lambda: fn(x.data_ptr(), x.numel())))
                second.append(timed(lambda: fn(x.data_ptr(), x.numel())))
            print(f"{runtime:<8} {statistics.median(opened):>15.2f} {statistics.median(first):>14.2f} "
                  f"{statistics.median(second):>15.3f}")
    assert float(x[0]) == 4 * a.loads  # every call ran


if __name__ == "__main__":
    main()
