"""Issue-5 table on a GPU: best kernel vs torch gather+SDPA vs starters, per contest case.

GPU time by CUDA-graph replay (L2 flushed before each replay, median of 20),
eager time of the whole call; floor = K+V bytes read / measured copy bandwidth.
A benchmark, not a test: kernels run in this process.

    [FLUSH=zero|read|none] [TABLE=perm|seq] [STARTER=0] python3 bench/decode_table.py KERNEL.py|KERNEL.cu [...]

FLUSH=zero (default, as the evaluator and triton's do_bench do) writes a 256 MiB buffer,
which leaves the L2 full of dirty lines that are written back while the timed kernel
runs; FLUSH=read evicts the L2 by reading the buffer, so nothing is written back;
FLUSH=none leaves the L2 as the last call left it.
TABLE=seq gives every sequence consecutive pages (the contest draws a permutation of a pool
three times the size): the difference is what scattered pages cost. STARTER=0 leaves the
package's slow starter out. Last, one line per kernel: geomean, % of floor on the three
largest cases, the peer cases beaten and the geomean speedup over the peer on its cases.
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tasks" / "flashattn_task_package"
CASES = [(bs, s) for s in (1024, 4096, 8192, 16384) for bs in (1, 4, 16)]
H, D, PAGE = 8, 128, 16
ANCHOR_GBS = 4270.0  # the H200 copy bandwidth behind issue 5's floor column
# issue 5's anchor: a peer's Triton decode, best of 4/8/16/32 splits (GPU us, H200)
PEER_US = {(1, 1024): 14.9, (16, 1024): 45.1, (1, 16384): 67.8, (16, 4096): 121.7, (16, 8192): 234.6,
           (16, 16384): 438.4}


def load(path: Path):
    """run_kernel of a Triton module, or of a CUDA file built with the evaluator's own backend."""
    if path.suffix == ".cu":
        import tempfile

        from optagent.worker.backends.cuda import CudaBackend

        backend = CudaBackend("cuda", None, 300)
        backend.prepare(path.resolve(), Path(tempfile.mkdtemp(prefix="decode_table_")))
        fn = backend.load_fresh(path.stem)
        fn.legacy_stream = True  # launches on the default stream: not capturable, timed with events
        return fn
    spec = importlib.util.spec_from_file_location(f"k_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_kernel


def torch_ref(q, k, v, out, seqlens, table, bs, seqlen_k, *rest):
    idx = table[:, : (seqlen_k + PAGE - 1) // PAGE]
    kk = k[idx].reshape(bs, -1, H, D)[:, :seqlen_k].transpose(1, 2)
    vv = v[idx].reshape(bs, -1, H, D)[:, :seqlen_k].transpose(1, 2)
    out.copy_(F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv).transpose(1, 2))


def make(bs: int, s: int):
    nb = max(1024, math.ceil(s / PAGE) * bs * 3)
    g = torch.Generator(device="cuda").manual_seed(bs * 100003 + s)
    q = torch.randn(bs, 1, H, D, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(nb, PAGE, H, D, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(nb, PAGE, H, D, dtype=torch.bfloat16, device="cuda", generator=g)
    out = torch.empty_like(q)
    seqlens = torch.full((bs,), s, dtype=torch.int32, device="cuda")
    if os.environ.get("TABLE", "perm") == "seq":
        table = torch.arange(nb, dtype=torch.int32, device="cuda").reshape(bs, -1)
    else:
        table = torch.randperm(nb, dtype=torch.int32, device="cuda", generator=g).reshape(bs, -1)
    return [q, k, v, out, seqlens, table, bs, s, 1, H, H, D, PAGE, nb, 0]


def flusher(buf: torch.Tensor, how: str) -> Callable[[], None]:
    """L2 flush by writing buf (dirty lines left behind), by reading it (clean lines), or none."""
    if how == "none":
        return lambda: None
    if how == "read":
        sink = torch.empty((), dtype=torch.int64, device=buf.device)
        return lambda: torch.sum(buf.view(torch.int64), dim=0, out=sink)
    return buf.zero_


def gpu_us(fn, args, flush) -> float:
    fn(*args)
    torch.cuda.synchronize()
    if getattr(fn, "legacy_stream", False):
        return event_median(lambda: fn(*args), flush)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    return event_median(g.replay, flush)


def event_median(call, flush, reps: int = 20) -> float:
    """Median GPU us of call() between two events, flush() queued ahead of each (the host's
    launch overlaps the flush, so launch latency stays out)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        flush()
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def eager_us(fn, args, flush) -> float:
    import time

    times = []
    for _ in range(20):
        flush()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    kernels = {"torch": torch_ref}
    if os.environ.get("STARTER", "1") != "0":
        kernels["starter"] = load(TASK / "starter" / "decode_triton.py")
    for p in sys.argv[1:]:
        kernels[Path(p).parent.parent.name[-12:] if Path(p).stem == "kernel" else Path(p).stem] = load(Path(p))
    from optagent.worker.bench import measured_bandwidth_gbs

    measured = measured_bandwidth_gbs()  # the evaluator's own measurement, cached per GPU
    bw = max(measured, ANCHOR_GBS)  # never a lower floor than the anchors use
    how = os.environ.get("FLUSH", "zero")
    flush = flusher(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), how)
    names = list(kernels)
    print(f"copy bandwidth {measured:.0f} GB/s measured, floor at {bw:.0f} GB/s; GPU us (graph replay, "
          f"L2 flushed by a {how}, median of 20) / eager us")
    print(f"{'bs/seqlen':<11}{'floor':>7}" + "".join(f"{n[:14]:>22}" for n in names) + f"{'% floor (last)':>16}{'peer us':>9}")
    geo = {n: [] for n in names}
    pct: dict[str, dict[tuple[int, int], float]] = {n: {} for n in names}
    wrong: dict[str, float] = {n: 0.0 for n in names}
    for bs, s in CASES:
        args = make(bs, s)
        floor = 2 * bs * s * H * D * 2 / (bw * 1e3)
        ref = args[3].clone()
        torch_ref(*args[:3], ref, *args[4:])
        row = f"{bs}/{s // 1024}k".ljust(11) + f"{floor:7.1f}"
        last = None
        for n, fn in kernels.items():
            out = args[3]
            out.fill_(float("nan"))
            fn(*args)
            torch.cuda.synchronize()
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            g, e = gpu_us(fn, args, flush), eager_us(fn, args, flush)
            geo[n].append(g)
            pct[n][(bs, s)] = 100 * floor / g
            wrong[n] = max(wrong[n], err)
            last = g
            row += f"{g:10.1f} /{e:8.1f}{'!' if err > 2e-2 else ' '}  "
        peer = PEER_US.get((bs, s))
        row += f"{100 * floor / last:14.0f}%" + (f"{peer:9.1f}{' beaten' if last < peer else ' NOT beaten'}" if peer else "")
        print(row)
    gm = {n: math.exp(sum(map(math.log, v)) / len(v)) for n, v in geo.items()}
    print("geomean GPU us: " + ", ".join(f"{n} {v:.1f}" for n, v in gm.items()))
    big = [(16, 8192), (4, 16384), (16, 16384)]
    print(f"{'kernel':<16}{'geomean us':>11}{'x torch':>8}" + "".join(f"{f'%fl {b}/{s // 1024}k':>12}" for b, s in big)
          + f"{'peer beaten':>12}{'x peer':>8}{'max err':>9}")
    for n in names:
        vs_peer = [PEER_US[(b, s)] / us for (b, s), us in zip(CASES, geo[n]) if (b, s) in PEER_US]
        beaten = sum(1 for r in vs_peer if r > 1)
        x_peer = math.exp(sum(map(math.log, vs_peer)) / len(vs_peer))  # geomean speedup over the peer's cases
        print(f"{n[:15]:<16}{gm[n]:11.1f}{gm['torch'] / gm[n]:8.2f}" + "".join(f"{pct[n][c]:11.0f}%" for c in big)
              + f"{beaten:>9}/{len(PEER_US)}{x_peer:8.3f}{wrong[n]:9.1e}")


if __name__ == "__main__":
    main()
