"""The paged_decode strategy library: format, integrity scan, and correctness on CPU.

Triton strategies run in Triton's CPU interpreter in subprocesses (TRITON_INTERPRET
must be set before triton is imported, and another test module may have imported
it already), all started together so the suite stays fast on two cores.  Each is
checked at its default knobs and at the smallest and largest value of every knob
(the others at their defaults), with the planner's own textual substitution,
against a float64 reference: ragged lengths (1, 15, 16, 17, 100, ...), GQA/MQA,
permuted block tables and garbage-filled slots nobody may read, an output
pre-filled with NaN.  CUDA strategies are compiled with nvcc at their default,
all-minimum and all-maximum knobs (skipped without nvcc).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.search.knobs import find_knobs, set_knobs
from optagent.schema import Language

from strategy_checks import check_manifest, check_scan_and_knobs, family

FAMILY, SPEC, STRATEGIES = family("paged_decode")
ROOT = Path(__file__).resolve().parents[1]
TRITON = [s for s in STRATEGIES if s.language is Language.TRITON]
CUDA = [s for s in STRATEGIES if s.language is Language.CUDA]

# Case parameters: (batch, heads, kv heads, headdim, seqlens, planned seqlen_k or None, seqlen_q, causal)
CASES = {
    "mha_ragged_d64": (3, 4, 4, 64, [1, 17, 100], None, 1, 0),
    "gqa2_ragged_d128": (3, 4, 2, 128, [15, 16, 100], None, 1, 0),
    "mqa4_d64": (2, 4, 1, 64, [32, 31], None, 1, 0),
    "single_page_direct": (1, 4, 4, 128, [16], None, 1, 0),
    "heads3_d64": (2, 3, 3, 64, [50, 7], None, 1, 0),
    "mha_many_splits": (2, 8, 8, 128, [300, 257], None, 1, 0),
    "longer_than_planned": (2, 2, 2, 64, [40, 33], 20, 1, 0),
    "sq3_causal_gqa2": (2, 4, 2, 64, [40, 33], None, 3, 1),
    "sq2_gqa2": (2, 4, 2, 64, [40, 33], None, 2, 0),
    "mha_small": (2, 4, 4, 64, [1, 50], None, 1, 0),
    "gqa2_small": (2, 4, 2, 64, [17, 50], None, 1, 0),
}
KNOB_CASES = ["mha_small", "gqa2_small"]  # at each knob extreme (the default runs every case)
# Too big for the interpreter, run on the GPU only, at the defaults and every knob extreme: long
# enough and wide enough (whole 2 KB cache rows, a grid over half the GPU) for the bulk-copy path,
# with partial last pages, a one-token sequence and one longer than the planned seqlen_k. With
# three sequences the grid is too small for the bulk path's usual ring and takes the deep one.
GPU_CASES = {"bulk_ragged_long": (5, 8, 8, 128, [16400, 16383, 1, 9000, 16384], 16384, 1, 0),
             "deep_ring_ragged": (3, 8, 8, 128, [16400, 1, 12345], 16384, 1, 0)}

RUNNER = r'''
import json, math, os, sys, traceback
os.environ["TRITON_INTERPRET"] = "1"
import importlib.util
import torch

CASES = json.loads(sys.argv[1])
JOBS = json.loads(sys.argv[2])
GARBAGE = 1e4


def make(B, H, HK, D, seqlens, seqlen_k, SQ, causal, seed, P=16):
    g = torch.Generator().manual_seed(seed)
    planned = seqlen_k or max(seqlens)
    need = -(-max(max(seqlens), planned) // P)
    nb = B * need * 3 + 1  # a pool three times the size needed; one page no table points to
    width = (nb - 1) // B
    q = torch.randn(B, SQ, H, D, generator=g).bfloat16()
    k = torch.randn(nb, P, HK, D, generator=g).bfloat16()
    v = torch.randn(nb, P, HK, D, generator=g).bfloat16()
    bt = torch.randperm(nb, generator=g)[: B * width].int().reshape(B, width).contiguous()
    used = torch.zeros(nb, P, dtype=torch.bool)
    for b in range(B):
        t = torch.arange(seqlens[b])
        used[bt[b, t // P].long(), t % P] = True
    # unreadable slots: keys along the query directions (they would dominate), huge values
    G = H // HK
    qdir = q.float().sum(dim=(0, 1)).reshape(HK, G, D).sum(1)
    qdir = qdir / qdir.norm(dim=-1, keepdim=True)
    k[~used] = (qdir * GARBAGE * math.sqrt(D)).bfloat16()
    v[~used] = GARBAGE
    out = torch.full((B, SQ, H, D), float("nan")).bfloat16()
    sl = torch.tensor(seqlens, dtype=torch.int32)
    return [q, k, v, out, sl, bt, B, planned, SQ, H, HK, D, P, nb, causal]


def reference(args):
    q, k, v, out, sl, bt, B, S, SQ, H, HK, D, P, nb, causal = args
    G = H // HK
    res = torch.zeros(B, SQ, H, D, dtype=torch.float64)
    for b in range(B):
        L = int(sl[b])
        idx = torch.arange(L)
        kk = k[bt[b, idx // P].long(), idx % P].double()
        vv = v[bt[b, idx // P].long(), idx % P].double()
        for sq in range(SQ):
            for h in range(H):
                s = kk[:, h // G] @ q[b, sq, h].double() / math.sqrt(D)
                if causal and SQ > 1:
                    s[idx >= L - SQ + 1 + sq] = -float("inf")
                res[b, sq, h] = torch.softmax(s, 0) @ vv[:, h // G]
    return res


DEVICE = sys.argv[3] if len(sys.argv) > 3 else "cpu"


def load(path):
    """run_kernel of a Triton module, or of a CUDA file built by the evaluator's backend."""
    if path.endswith(".cu"):
        import tempfile
        from pathlib import Path
        from optagent.worker.backends.cuda import CudaBackend
        backend = CudaBackend("cuda", None, 300)
        backend.prepare(Path(path), Path(tempfile.mkdtemp(prefix="decode_cu_")))
        return backend.load_fresh(os.path.basename(path)[:-3])
    spec = importlib.util.spec_from_file_location("variant_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_kernel


MADE = {}  # (case, seed) -> inputs and reference: the big cases are made once for all variants


def made(name, seed):
    if (name, seed) not in MADE:
        args = make(*CASES[name], seed=seed)
        MADE[name, seed] = (args, reference(args))
    return MADE[name, seed]


for path, case_names, again in JOBS:
    try:
        run_kernel = load(path)
    except Exception:
        print(json.dumps({"variant": path, "case": None, "error": traceback.format_exc()[-1500:]}), flush=True)
        continue
    for i, name in enumerate(case_names):
        rec = {"variant": path, "case": name}
        try:
            runs = [made(name, i)]
            if name in again:  # a second call on new inputs: cached scratch and counters are reused
                runs.append(made(name, 100 + i))
            errs, finite = [], True
            for args, ref in runs:
                dev = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
                run_kernel(*dev)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                o = dev[3].double().cpu()
                finite = finite and bool(torch.isfinite(o).all())
                errs.append(float((o - ref).norm() / ref.norm()))
            rec["finite"], rec["err"] = finite, max(errs)
        except Exception:
            rec["error"] = traceback.format_exc()[-1500:]
        print(json.dumps(rec), flush=True)
'''


def _variants(source: str) -> list[tuple[str, dict]]:
    """Default knobs, then each knob at its smallest and largest listed value."""
    out = [("default", {})]
    for k in find_knobs(source):
        for v in sorted({min(k.values), max(k.values)}):
            if v != k.value:
                out.append((f"{k.name}={v}", {k.name: v}))
    return out


def _variant_jobs(source: str, folder: Path, name: Path, extra: tuple[str, ...] = ()) -> tuple[list, dict[str, str]]:
    """The runner's jobs: every case at the defaults (the knob cases twice), the knob cases
    and `extra` at each extreme; and each written variant's label."""
    jobs, labels = [], {}
    for label, setting in _variants(source):
        path = folder / f"{name.stem}__{label.replace('=', '_')}{name.suffix}"
        path.write_text(set_knobs(source, setting) if setting else source)
        labels[str(path)] = label
        at_default = [str(path), [*CASES, *extra], [*KNOB_CASES, *extra]]
        jobs.append(at_default if label == "default" else [str(path), [*KNOB_CASES, *extra], []])
    return jobs, labels


def _nvcc_build(source: str, setting: dict, out: Path) -> subprocess.Popen:
    src = out.with_suffix(".cu")
    src.write_text(set_knobs(source, setting) if setting else source)
    cmd = ["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", str(out), str(src)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    """Starts every interpreter run (one subprocess per Triton strategy) and nvcc build at once."""
    base = tmp_path_factory.mktemp("paged_decode")
    runner = base / "runner.py"
    runner.write_text(RUNNER)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    interp = {}
    for s in TRITON:
        source = (FAMILY / s.file).read_text(encoding="utf-8")
        jobs, labels = _variant_jobs(source, base, Path(s.file))
        cmd = [sys.executable, str(runner), json.dumps(CASES), json.dumps(jobs)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        interp[s.name] = (proc, labels, jobs)
    builds = {}
    if shutil.which("nvcc"):
        for s in CUDA:
            source = (FAMILY / s.file).read_text(encoding="utf-8")
            knobs = find_knobs(source)
            settings = {"default": {}, "min": {k.name: min(k.values) for k in knobs},
                        "max": {k.name: max(k.values) for k in knobs}}
            builds[s.name] = [(label, base / f"{Path(s.file).stem}__{label}.so",
                               _nvcc_build(source, setting, base / f"{Path(s.file).stem}__{label}.so"))
                              for label, setting in settings.items()]
    yield interp, builds
    for proc, _, _ in interp.values():
        if proc.poll() is None:
            proc.kill()
    for items in builds.values():
        for _, _, proc in items:
            if proc.poll() is None:
                proc.kill()


def test_strategy_manifest_lists_existing_files_with_the_contest_signature():
    assert SPEC.family == "paged_decode"
    check_manifest(FAMILY, SPEC, 15)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_passes_the_integrity_scan_and_declares_knobs(strategy):
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    check_scan_and_knobs(source, strategy.language)


@pytest.mark.parametrize("strategy", TRITON, ids=lambda s: s.name)
def test_triton_strategy_is_correct_at_every_knob_extreme(strategy, background):
    proc, labels, jobs = background[0][strategy.name]
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    recs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, stderr[-3000:]
    expected = sum(len(cases) for _, cases, _ in jobs)
    assert len(recs) == expected, f"{len(recs)} results for {expected} runs\n{stderr[-3000:]}"
    bad = []
    for r in recs:
        label = labels.get(r["variant"], r["variant"])
        if "error" in r:
            bad.append(f"{label} / {r['case']}: {r['error']}")
        elif not r["finite"]:
            bad.append(f"{label} / {r['case']}: output not fully written (NaN left)")
        elif r["err"] > 1e-2:
            bad.append(f"{label} / {r['case']}: relative error {r['err']:.3g}")
    assert not bad, "\n".join(bad)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("strategy", CUDA, ids=lambda s: s.name)
def test_cuda_strategy_compiles_at_default_and_knob_extremes(strategy, background):
    failures = []
    for label, so, proc in background[1][strategy.name]:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0 or not so.exists():
            failures.append(f"{label}: {out[-2000:]}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("strategy", CUDA, ids=lambda s: s.name)
def test_cuda_strategy_is_correct_on_the_gpu_at_every_knob_extreme(strategy, tmp_path):
    """What the CPU can only compile, run: every case at the defaults (twice where the
    cached plan and scratch are reused), the small ones at each knob's extremes."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    jobs, labels = _variant_jobs(source, tmp_path, Path(strategy.file), tuple(GPU_CASES))
    from optagent.worker.backends.cuda import build_all

    failed = build_all([Path(p) for p in labels])  # all variants at once, into the backend's cache
    assert not failed, "\n".join(f"{labels[str(p)]}: {e}" for p, e in failed.items())
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    try:
        proc = subprocess.run([sys.executable, str(runner), json.dumps({**CASES, **GPU_CASES}), json.dumps(jobs), "cuda"],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:  # a hung kernel: name the run after the last one that finished
        done = [line for line in (e.stdout or b"").decode().splitlines() if line.startswith("{")]
        pytest.fail(f"hung after {len(done)} runs; last finished: {done[-1] if done else 'none'}")
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(recs) == sum(len(cases) for _, cases, _ in jobs), proc.stderr[-3000:]
    bad = [f"{labels.get(r['variant'], r['variant'])} / {r['case']}: "
           + (r["error"] if "error" in r else "NaN left" if not r["finite"] else f"relative error {r['err']:.3g}")
           for r in recs if "error" in r or not r["finite"] or r["err"] > 1e-2]
    assert not bad, "\n".join(bad)


def test_bench_default_variants_name_knobs_the_strategies_have(tmp_path):
    """bench/decode_variants.py's default list is only run on a GPU: a knob it names that a
    strategy dropped would cost a device call to find out."""
    spec = importlib.util.spec_from_file_location("decode_variants", ROOT / "bench" / "decode_variants.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    written = [bench.variant(s, tmp_path) for s in bench.DEFAULT]
    assert len(written) == len(bench.DEFAULT) and all(p.stat().st_size > 0 for p in written)


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None, reason="nvcc or nm not installed")
def test_bench_trace_patches_and_builds_the_bulk_kernel(tmp_path, monkeypatch):
    """bench/decode_trace.py patches timestamps in at anchors of the bulk kernel and builds it
    as the evaluator does (object check included): an anchor an edit of the kernel moved, or
    a trace the check refuses, would otherwise cost a device call to find out."""
    from optagent.worker.backends.cuda import build_all

    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("decode_trace", ROOT / "bench" / "decode_trace.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    source = bench.patched(bench.SOURCE)
    stamped = set(re.findall(r"stamp\((\d+)\);", source))
    assert stamped == {str(k) for k in range(bench.POINTS)}  # every point, and no other
    moved = tmp_path / "moved.cu"  # an edit the trace no longer fits
    moved.write_text(bench.SOURCE.read_text().replace("if (!s_last) return;", "if (!s_last) { return; }"))
    with pytest.raises(AssertionError, match=r"no anchor for points \[5\]"):
        bench.patched(moved)
    cu = tmp_path / "trace.cu"
    cu.write_text(source)
    assert build_all([cu], device="cpu") == {}


def test_a_strategy_not_yet_gpu_checked_stays_out_of_runs():
    from optagent.search.planners.offline import load_strategies

    listed = {s.name for s in CUDA}
    unchecked = {s.name for s in CUDA if not s.gpu_checked}
    loaded = {s.name for s in load_strategies(Language.CUDA, "paged_decode", [])}
    assert loaded == listed - unchecked
