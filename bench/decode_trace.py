"""Where a bulk-kernel launch spends its time, block by block, on a GPU.

Builds agent/search/strategies/paged_decode/splitkv_bulk.cu (or $SOURCE) with timestamps
(%globaltimer) patched in at POINTS places of every block. Per case and L2 flush (FLUSHES:
zero, read, none) it prints medians over launches of: the wait for the first tile, the
stream (median and slowest block), how long after the first block finished streaming the
last one did, then for the block whose merge of the splits ended last each step after its
stream (streams merged in shared memory, partials written, fence, ticket, row list, the
merge's loads, its groups' reduction, its write), and the launch from the first entry to the
last exit. The kernel runs in this process, launched on its own (no graph). A benchmark,
not a test.

    [SOURCE=FILE.cu] [FLUSHES="zero read none"] python3 bench/decode_trace.py [BS/SEQLEN ...]   (default: 4/16384 16/4096 16/16384)
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_table import flusher, make  # same inputs and flushes as the table

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "agent" / "search" / "strategies" / "paged_decode" / "splitkv_bulk.cu"
# Stamps: 0 entry, 1 its first tile landed (bulk path), 2 token stream done, 8 streams' state in
# shared memory, 3 partials written, 4 fenced, 5 ticket taken, 6 merge of the splits started,
# 9 its loads merged, 10 its groups reduced, 7 merge done (the last block of a unit).
POINTS = 11
BLOCKS = 1 << 16  # trace rows: blocks of a launch, at the most
# (anchor in the kernel, what goes in front of it, what goes after it). An anchor occurs once
# or not at all (the older kernels kept for side-by-side tables lack some); every point must
# be stamped somewhere. The merge of the splits has two ways (staged or per-thread loads),
# each stamped.
DEFINE = (f"__device__ unsigned long long g_trace[{BLOCKS}][{POINTS}];\n"
          "__device__ __forceinline__ void stamp(int k) {\n"
          "    unsigned long long t;\n    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
          "    if (threadIdx.x == 0) g_trace[blockIdx.y * gridDim.x + blockIdx.x][k] = t;\n}\n")
PATCHES = [
    ("namespace {\n", DEFINE, ""),
    ("    const int gc = unit % p.gchunks;\n", "    stamp(0);\n    bool first_tile = true;\n", ""),
    ("            bar_wait(bars + st, phase);\n", "", "            if (first_tile) { stamp(1); first_tile = false; }\n"),
    ("    // Merge the streams of each kv head", "    stamp(2);\n", ""),
    ("    const bool direct = (n_act == 1);\n", "    stamp(8);\n", ""),
    ("    if (direct) return;\n", "", "    stamp(3);\n"),
    ("        const int ticket = atomicAdd", "        stamp(4);\n", ""),
    ("    if (!s_last) return;\n", "    stamp(5);\n", ""),
    ("    merge_splits<NT, GT, BULK>(p", "    stamp(6);\n", ""),
    ("    combine<NT>(p", "    stamp(6);\n", ""),
    # per-thread loads: loads merged, groups reduced
    ("        if (groups > 1) {", "        stamp(9);\n", ""),
    ("            const float inv = l > 0.f", "            if (idx == 0) stamp(10);\n", ""),
    # staged: weights made and partials landed, sums done
    ("    bar_wait(bar, 0);\n", "", "    stamp(9);\n"),
    ("        const float inv = wr[STAGED_SPLITS];", "        if (idx == 0) stamp(10);\n", ""),
    ("}\n\ntemplate <int LANES, int GT, bool BULK, int NT>\nstruct Kernel", "    stamp(7);\n", ""),
]
READER = (f'\nextern "C" int trace_read(unsigned long long* host, int blocks) {{\n'
          f"    return (int)cudaMemcpyFromSymbol(host, g_trace, sizeof(unsigned long long) * {POINTS} * blocks);\n}}\n"
          'extern "C" int trace_clear() {\n    void* p = nullptr;\n'
          "    if (cudaGetSymbolAddress(&p, g_trace) != cudaSuccess) return 1;\n"
          "    return (int)cudaMemset(p, 0, sizeof(g_trace));\n}\n")


def patched(source: Path) -> str:
    src = source.read_text(encoding="utf-8")
    for anchor, before, after in PATCHES:
        assert src.count(anchor) <= 1, f"decode_trace.py: anchor not unique in {source.name}: {anchor.strip()}"
        src = src.replace(anchor, before + anchor + after)
    missing = [k for k in range(POINTS) if f"stamp({k});" not in src]
    assert not missing, f"decode_trace.py: no anchor for points {missing} in {source.name}: the kernel moved"
    return src + READER


def build(source: Path, folder: Path) -> ctypes.CDLL:
    """The patched kernel, built as the evaluator builds a candidate (same flags, object check)."""
    from optagent.worker.backends.cuda import CudaBackend

    cu = folder / "trace.cu"
    cu.write_text(patched(source), encoding="utf-8")
    backend = CudaBackend("cuda", None, 300)
    backend.prepare(cu, folder)
    lib = ctypes.CDLL(str(backend.library))
    lib.run_kernel.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 9
    lib.trace_read.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def launch_profile(lib: ctypes.CDLL, args: list, flush, reps: int = 15) -> dict[str, float]:
    ptrs = [a.data_ptr() for a in args[:6]]
    n = BLOCKS
    host = (ctypes.c_ulonglong * (POINTS * n))()
    rows: dict[str, list[float]] = {}
    for _ in range(reps):
        assert lib.trace_clear() == 0, "cudaMemset of the trace failed"
        flush()
        torch.cuda.synchronize()
        lib.run_kernel(*ptrs, *args[6:])
        torch.cuda.synchronize()
        assert lib.trace_read(host, n) == 0, "cudaMemcpyFromSymbol failed"
        raw = [host[POINTS * i: POINTS * i + POINTS] for i in range(n)]
        t0 = min(b[0] for b in raw if b[0])
        live = [[(x - t0) / 1e3 if x >= t0 else None for x in b] for b in raw if b[0] >= t0 and b[2] >= t0]
        stream = [b[2] - (b[1] if b[1] is not None else b[0]) for b in live]
        first = [b[1] - b[0] for b in live if b[1] is not None]
        last = max((b for b in live if b[7] is not None), key=lambda b: b[7], default=None)
        span = lambda b, i, j: b[j] - b[i] if b is not None and b[i] is not None and b[j] is not None else 0.0
        stats = {"blocks": len(live), "first tile": statistics.median(first) if first else 0.0,
                 "stream med": statistics.median(stream), "stream max": max(stream),
                 "finish spread": max(b[2] for b in live) - min(b[2] for b in live),
                 # the block whose merge ended last, step by step
                 "smem": span(last, 2, 8), "partials": span(last, 8, 3), "fence": span(last, 3, 4), "ticket": span(last, 4, 5),
                 "rows": span(last, 5, 6), "m loads": span(last, 6, 9), "m groups": span(last, 9, 10),
                 "m write": span(last, 10, 7),
                 "after stream": (last[7] - max(b[2] for b in live)) if last else 0.0,
                 "launch": max(max(x for x in b if x is not None) for b in live)}
        for k, v in stats.items():
            rows.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> None:
    cases = [tuple(int(x) for x in c.split("/")) for c in sys.argv[1:]] or [(4, 16384), (16, 4096), (16, 16384)]
    source = Path(os.environ.get("SOURCE") or SOURCE)  # unset or empty: the strategy itself
    lib = build(source, Path(tempfile.mkdtemp(prefix="decode_trace_")))
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    cols = None
    for how in os.environ.get("FLUSHES", "zero read").split():  # "none": no flush at all
        flush = flusher(big, how)
        for bs, s in cases:
            args = make(bs, s)
            prof = launch_profile(lib, args, flush)
            if cols is None:
                cols = list(prof)
                print(f"{source.name}: us, median of 15 launches")
                print(f"{'case':<13}" + "".join(f"{c:>13}" for c in cols))
            print(f"{f'{bs}/{s // 1024}k {how}':<13}" + "".join(f"{prof[c]:13.1f}" for c in cols))


if __name__ == "__main__":
    main()
