"""CPU tests of tasks/flashattn_task_package and the flash_attn stand-in (agent/worker/compat).

* testcase_config.py: the same 12 cases, shapes, seeds and tensors as the contest's
  own package (compared with the seed copy in ../shared when it is there);
* the PyTorch stand-in for flash_attn_with_kvcache against a float64 loop reference;
* optagent_hooks.py: make_case, reference, bytes_moved, flops, describe, and that
  the hidden cases really catch reading past cache_seqlens or skipping a page;
* the Triton starter under TRITON_INTERPRET=1 (in a subprocess, so the variable is
  set before triton is imported) on every smoke and hidden case;
* the CUDA starter compiles with nvcc (when nvcc is installed).
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "tasks" / "flashattn_task_package"
COMPAT = REPO / "agent" / "worker" / "compat"
SEED_CONFIG = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "seed"
    / "flashattn_task_package"
    / "xpuoj_problem"
    / "testcase_config.py"
)
MANIFEST = tomllib.loads((PKG / "optagent.toml").read_text())
CASES = [("smoke", i, p) for i, p in enumerate(MANIFEST["smoke"])] + [
    ("hidden", i, p) for i, p in enumerate(MANIFEST["hidden"])
]
CASE_IDS = [f"{kind}-{i + 1}" for kind, i, _ in CASES]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cfg():
    return _load("optagent_test_testcase_config", PKG / "xpuoj_problem" / "testcase_config.py")


@pytest.fixture(scope="module")
def seed_cfg():
    if not SEED_CONFIG.is_file():
        pytest.skip(f"seed package not found at {SEED_CONFIG}")
    return _load("optagent_test_seed_testcase_config", SEED_CONFIG)


@pytest.fixture(scope="module")
def hooks():
    return _load("optagent_test_flashattn_hooks", PKG / "optagent_hooks.py")


@pytest.fixture(scope="module")
def standin():
    return _load("optagent_test_flash_attn_interface", COMPAT / "flash_attn" / "flash_attn_interface.py")


def _case_size(module, monkeypatch, text: str):
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    return module.getTestCaseSize()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


# --------------------------------------------------------------------------- contest interface


def test_twelve_cases(cfg):
    assert cfg.getNumOfTestcases() == 12


@pytest.mark.parametrize("number", range(1, 13))
def test_case_sizes_match_seed(cfg, seed_cfg, monkeypatch, number):
    ours = _case_size(cfg, monkeypatch, f"{number}\n")
    theirs = _case_size(seed_cfg, monkeypatch, f"{number}\n")
    assert ours == theirs
    assert tuple(cfg.CURRENT_CASE.values()) == tuple(seed_cfg.CURRENT_CASE)


@pytest.mark.parametrize("text", ["", "0\n", "13\n", "-2\n", "abc\n", " 7 extra\n"])
def test_case_index_fallbacks_match_seed(cfg, seed_cfg, monkeypatch, text):
    assert _case_size(cfg, monkeypatch, text) == _case_size(seed_cfg, monkeypatch, text)
    assert tuple(cfg.CURRENT_CASE.values()) == tuple(seed_cfg.CURRENT_CASE)


def test_case_sizes_without_seed(cfg, monkeypatch):
    shapes, (warmup, iters) = _case_size(cfg, monkeypatch, "12\n")
    # case 12: batch 16, seqlen 16384 -> 3 * 16 * 1024 pages
    assert shapes[0] == (16, 1, 8, 128)
    assert shapes[1] == shapes[2] == (49152, 16, 8, 128)
    assert shapes[5] == (16, 3072)
    assert len(shapes) == 15 and shapes[6:] == [()] * 9
    assert (warmup, iters) == (3, 12)  # 16 * 16384 * 128 work units: 100 halved three times
    shapes, _ = _case_size(cfg, monkeypatch, "1\n")
    assert shapes[1] == (1024, 16, 8, 128)  # the 1024-page floor


def test_gen_test_case_matches_seed(cfg, seed_cfg, monkeypatch):
    sizes = _case_size(cfg, monkeypatch, "1\n")[0]
    ours = cfg.genTestCase(sizes, device="cpu")
    sizes = _case_size(seed_cfg, monkeypatch, "1\n")[0]
    theirs = seed_cfg.genTestCase(sizes, device="cpu")
    assert len(ours) == len(theirs) == 15
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if i == 3:  # output: uninitialised in both
            assert a.shape == b.shape and a.dtype == b.dtype
        elif torch.is_tensor(a):
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
            assert torch.equal(a, b), f"argument {i} differs"
        else:
            assert a == b and type(a) is int


def test_check(cfg, hooks):
    args = hooks.make_case(MANIFEST["smoke"][0], "cpu", 0)
    good = list(args)
    good[3] = hooks.reference(args, torch.float64)[0].to(torch.bfloat16)
    assert cfg.check(None, args, good, good)
    bad = list(good)
    bad[3] = good[3] + 0.5
    assert not cfg.check(None, args, bad, good)
    nan = list(good)
    nan[3] = torch.full_like(good[3], math.nan)
    assert not cfg.check(None, args, nan, good)
    wrong_shape = list(good)
    wrong_shape[3] = good[3][:, :, :1]
    assert not cfg.check(None, args, wrong_shape, good)
    wrong_dtype = list(good)
    wrong_dtype[3] = good[3].float()
    assert not cfg.check(None, args, wrong_dtype, good)


def test_baseline_uses_standin(cfg, hooks):
    args = hooks.make_case(MANIFEST["hidden"][1], "cpu", 3)
    result = cfg.baseline(*args)
    import flash_attn

    if not getattr(flash_attn, "STANDIN", False):
        pytest.skip("a real flash_attn is installed")
    assert result[3] is args[3]
    want = hooks.reference(args, torch.float64)[0]
    assert rel_err(args[3], want) < 5e-3


def test_docs_front_matter():
    problem = PKG / "xpuoj_problem"
    meta = json.loads((problem / "meta.json").read_text())
    assert set(meta["locales"]) == {"zh_CN", "en"}
    for locale in meta["locales"]:
        folder = problem / locale
        assert (folder / "_title.txt").read_text().strip()
        langs, types = [], []
        for md in sorted(folder.glob("*.md")):
            head = md.read_text().split("---")[1]
            fields = dict(re.findall(r'^(\w+):\s*"([^"]*)"\s*$', head, re.M))
            assert fields.get("sectionTitle"), md
            types.append(fields["type"])
            if fields["type"] == "codeSample":
                langs.append(fields["lang"])
            else:
                assert fields["type"] == "Text" and "lang" not in fields, md
        assert sorted(langs) == ["cuda", "tilelang", "triton"], locale
        assert types.count("Text") == 4, locale  # statement, input, output, example


# --------------------------------------------------------------------------- the stand-in


def loop_reference(q, k_cache, v_cache, seqlens, block_table=None, causal=False, scale=None):
    """Float64 attention, one (batch, head, query) at a time, straight from the definition."""
    batch, seqlen_q, heads, dim = q.shape
    heads_k = k_cache.shape[2]
    scale = scale if scale is not None else dim**-0.5
    out = torch.zeros(batch, seqlen_q, heads, v_cache.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, heads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        n = int(seqlens[b])
        if block_table is None:
            keys, vals = k_cache[b, :n], v_cache[b, :n]
        else:
            page = k_cache.shape[1]
            idx = [(int(block_table[b, t // page]), t % page) for t in range(n)]
            keys = torch.stack([k_cache[p, s] for p, s in idx]) if idx else k_cache[:0, 0]
            vals = torch.stack([v_cache[p, s] for p, s in idx]) if idx else v_cache[:0, 0]
        for h in range(heads):
            kh = h // (heads // heads_k)
            for i in range(seqlen_q):
                visible = min(n, n - seqlen_q + i + 1) if causal else n
                if visible <= 0:
                    continue
                s = (keys[:visible, kh].double() @ q[b, i, h].double()) * scale
                w = torch.softmax(s, dim=0)
                out[b, i, h] = w @ vals[:visible, kh].double()
                lse[b, h, i] = torch.logsumexp(s, dim=0)
    return out, lse


def _paged_inputs(seed, batch, lengths, heads, heads_k, dim, page, seqlen_q=1, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    per_seq = max(math.ceil(n / page) for n in lengths) + 1
    num_blocks = batch * per_seq + 3
    q = torch.randn(batch, seqlen_q, heads, dim, generator=gen).to(dtype)
    k = torch.randn(num_blocks, page, heads_k, dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, page, heads_k, dim, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen)[: batch * per_seq].reshape(batch, per_seq).int()
    return q, k, v, torch.tensor(lengths, dtype=torch.int32), table


@pytest.mark.parametrize(
    "batch,lengths,heads,heads_k,dim,page,seqlen_q,causal",
    [
        (3, [1, 17, 40], 6, 2, 32, 16, 1, False),  # ragged + GQA
        (2, [16, 33], 4, 4, 64, 16, 1, True),  # causal is a no-op for one query
        (2, [2, 20], 4, 1, 32, 8, 3, True),  # causal multi-query, a query that sees nothing
        (2, [5, 9], 2, 2, 16, 4, 2, False),
    ],
)
def test_standin_paged(standin, batch, lengths, heads, heads_k, dim, page, seqlen_q, causal):
    q, k, v, seqlens, table = _paged_inputs(7, batch, lengths, heads, heads_k, dim, page, seqlen_q)
    out, lse = standin.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seqlens, block_table=table, causal=causal, return_softmax_lse=True
    )
    want, want_lse = loop_reference(q, k, v, lengths, table, causal)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (batch, heads, seqlen_q)
    assert rel_err(out, want) < 5e-3  # bf16 rounding of the output
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse[finite].double(), want_lse[finite], atol=1e-4)
    assert torch.equal(torch.isinf(lse), ~finite)
    # float64 inputs are computed in float64
    out64 = standin.flash_attn_with_kvcache(
        q.double(), k.double(), v.double(), cache_seqlens=seqlens, block_table=table, causal=causal
    )
    assert out64.dtype == torch.float64
    assert torch.allclose(out64, want, atol=1e-10)


def test_standin_unpaged_int_seqlens_and_scale(standin):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 24, 2, 32, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 24, 2, 32, generator=gen, dtype=torch.float64)
    out = standin.flash_attn_with_kvcache(q, k, v, cache_seqlens=19, softmax_scale=0.3)
    want, _ = loop_reference(q, k, v, [19, 19], None, False, scale=0.3)
    assert torch.allclose(out, want, atol=1e-10)
    full = standin.flash_attn_with_kvcache(q, k, v)  # no cache_seqlens: the whole cache
    assert torch.allclose(full, loop_reference(q, k, v, [24, 24])[0], atol=1e-10)


def test_standin_paged_default_seqlens(standin):
    q, k, v, _, table = _paged_inputs(2, 2, [32, 32], 2, 2, 16, 16)
    out = standin.flash_attn_with_kvcache(q.double(), k.double(), v.double(), block_table=table)
    capacity = table.shape[1] * 16
    assert torch.allclose(out, loop_reference(q, k, v, [capacity] * 2, table)[0], atol=1e-10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": "x"},
        {"v": "x"},
        {"rotary_cos": "x", "rotary_sin": "x"},
        {"cache_batch_idx": "x"},
        {"cache_leftpad": "x"},
        {"alibi_slopes": "x"},
        {"window_size": (8, -1)},
        {"softcap": 30.0},
    ],
)
def test_standin_refuses_unimplemented(standin, kwargs):
    q, k, v, seqlens, table = _paged_inputs(0, 1, [5], 2, 2, 16, 16)
    kwargs = {key: (torch.zeros(1) if val == "x" else val) for key, val in kwargs.items()}
    with pytest.raises(NotImplementedError, match="stand-in"):
        standin.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table, **kwargs)


def test_standin_package_flags():
    sys.path.insert(0, str(COMPAT))
    try:
        spec = importlib.util.spec_from_file_location(
            "optagent_test_flash_attn_pkg",
            COMPAT / "flash_attn" / "__init__.py",
            submodule_search_locations=[str(COMPAT / "flash_attn")],
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = pkg
        spec.loader.exec_module(pkg)
    finally:
        sys.path.remove(str(COMPAT))
        sys.modules.pop("optagent_test_flash_attn_pkg", None)
    assert pkg.STANDIN is True
    assert pkg.__version__ == "0.0.0+optagent-standin"
    assert callable(pkg.flash_attn_with_kvcache)


# --------------------------------------------------------------------------- hooks and manifest


def test_manifest():
    task = MANIFEST["task"]
    assert task["family"] == "paged_decode" and task["outputs"] == [3]
    assert (PKG / task["hooks"]).is_file()
    assert task["tolerance_factor"] > 1 and task["min_tolerance"] > 0
    assert 3 <= len(MANIFEST["smoke"]) <= 4 and len(MANIFEST["hidden"]) >= 3


@pytest.mark.parametrize("kind,index,params", CASES, ids=CASE_IDS)
def test_make_case(hooks, kind, index, params):
    args = hooks.make_case(params, "cpu", 11)
    again = hooks.make_case(params, "cpu", 11)
    other = hooks.make_case(params, "cpu", 12)
    assert len(args) == 15
    q, k, v, out, seqlens, table = args[:6]
    batch, seqlen_k, seqlen_q, heads, heads_k, dim, page, num_blocks, causal = args[6:]
    assert all(type(x) is int for x in args[6:])
    assert q.dtype == k.dtype == v.dtype == out.dtype == torch.bfloat16
    assert seqlens.dtype == table.dtype == torch.int32
    assert q.shape == out.shape == (batch, seqlen_q, heads, dim)
    assert k.shape == v.shape == (num_blocks, page, heads_k, dim)
    assert table.shape == (batch, num_blocks // batch)
    assert all(t.is_contiguous() for t in args[:6])
    assert seqlen_k == int(seqlens.max()) and seqlens.min() >= 1
    assert torch.isnan(out.float()).all()
    assert len(set(table.flatten().tolist())) == table.numel()  # a permutation of the pool
    for a, b in zip(args[:6], again[:6]):
        assert torch.equal(a, b) or (torch.isnan(a.float()).all() and torch.isnan(b.float()).all())
    assert not torch.equal(q, other[0])
    if kind == "hidden":
        readable = torch.zeros(num_blocks, page, dtype=torch.bool)
        for b, n in enumerate(seqlens.tolist()):
            for t in range(n):
                readable[table[b, t // page], t % page] = True
        for cache in (k, v):
            assert (cache.float().abs().amax(dim=(2, 3))[readable] < 20).all()
            assert torch.isfinite(cache.float()).all()
        assert (v.float().abs()[~readable] >= 0.4 * params["garbage"]).all()
        assert (k.float().norm(dim=-1)[~readable] >= 0.4 * params["garbage"] * dim**0.5).all()
        # Every garbage key a sequence might wrongly read (the tail of its own last
        # page, any unused page) scores hugely positive for each of its query heads.
        group = heads // heads_k
        last_pages = [int(table[b, math.ceil(n / page) - 1]) for b, n in enumerate(seqlens.tolist())]
        for b in range(batch):
            mine = ~readable
            mine[[p for i, p in enumerate(last_pages) if i != b]] = False
            for h in range(heads):
                scores = k[:, :, h // group].float() @ q[b, 0, h].float()
                assert (scores[mine] > 100).all(), (b, h)


def _tolerance(hooks, args, ref):
    own = rel_err(hooks.reference(args, torch.bfloat16)[0], ref)
    return max(MANIFEST["task"]["min_tolerance"], MANIFEST["task"]["tolerance_factor"] * own)


@pytest.mark.parametrize("kind,index,params", CASES, ids=CASE_IDS)
def test_reference_matches_standin(hooks, standin, kind, index, params):
    args = hooks.make_case(params, "cpu", index)
    before = [a.clone() if torch.is_tensor(a) else a for a in args]
    ref = hooks.reference(args, torch.float64)[0]
    bf16 = hooks.reference(args, torch.bfloat16)[0]
    for a, b in zip(args, before):
        assert (torch.equal(a, b) or torch.isnan(b.float()).all()) if torch.is_tensor(a) else a == b
    assert ref.dtype == torch.float64 and bf16.dtype == torch.bfloat16 and ref.shape == args[0].shape
    got = standin.flash_attn_with_kvcache(
        args[0].double(), args[1], args[2], cache_seqlens=args[4], block_table=args[5], causal=bool(args[14])
    )
    assert torch.allclose(got, ref, atol=1e-10)
    assert rel_err(bf16, ref) < 1.5e-2
    assert _tolerance(hooks, args, ref) < 0.05


@pytest.mark.parametrize("index", range(len(MANIFEST["hidden"])))
def test_hidden_cases_catch_reading_past_the_end(hooks, index):
    args = hooks.make_case(MANIFEST["hidden"][index], "cpu", index)
    ref = hooks.reference(args, torch.float64)[0]
    for b in range(args[6]):
        longer = list(args)
        longer[4] = args[4].clone()
        longer[4][b] += 1  # one garbage token too many in one sequence
        assert rel_err(hooks.reference(longer, torch.float64)[0], ref) > 100 * _tolerance(hooks, args, ref)


def test_long_hidden_case_catches_a_skipped_page(hooks):
    params = max(MANIFEST["hidden"], key=lambda p: max(p["seqlens"]))
    assert max(params["seqlens"]) >= 300
    args = hooks.make_case(params, "cpu", 0)
    ref = hooks.reference(args, torch.float64)[0]
    tol = _tolerance(hooks, args, ref)
    page = args[12]
    n = int(args[4][0])
    pages = math.ceil(n / page)
    for skip in range(pages):  # the sequence with one page left out
        table = args[5].clone()
        row = table[0].tolist()
        row = row[:skip] + row[skip + 1 :] + row[-1:]
        table[0] = torch.tensor(row, dtype=torch.int32)
        seqlens = args[4].clone()
        seqlens[0] = n - min(page, n - skip * page)
        skipped = list(args)
        skipped[4], skipped[5] = seqlens, table
        assert rel_err(hooks.reference(skipped, torch.float64)[0], ref) > 2 * tol, f"page {skip}"


def test_bytes_flops_describe(hooks):
    args = hooks.make_case({"batch_size": 2, "seqlens": [17, 32], "num_heads": 4, "num_heads_k": 2, "headdim": 64}, "cpu", 0)
    q_bytes = 2 * 1 * 4 * 64 * 2
    kv_bytes = 2 * (17 + 32) * 2 * 64 * 2  # K and V, 2 KV heads, bf16
    table_bytes = (2 + 2) * 4
    assert hooks.bytes_moved(args) == q_bytes + kv_bytes + table_bytes + 2 * 4 + q_bytes
    assert hooks.flops(args) == 4 * 64 * 4 * (17 + 32)
    assert hooks.describe(args) == "bs=2 seqlen=[17,32] h=4/2 d=64"
    uniform = hooks.make_case({"batch_size": 1, "seqlen_k": 40, "num_heads": 8, "headdim": 128}, "cpu", 0)
    assert hooks.describe(uniform) == "bs=1 seqlen=40 h=8/8 d=128"
    causal = hooks.make_case(
        {"batch_size": 1, "seqlen_k": 10, "num_heads": 2, "headdim": 16, "seqlen_q": 3, "causal": 1}, "cpu", 0
    )
    assert hooks.flops(causal) == 4 * 16 * 2 * (8 + 9 + 10)
    assert hooks.describe(causal) == "bs=1 seqlen=10 h=2/2 d=16 sq=3 causal"


# --------------------------------------------------------------------------- starters


def test_triton_starter_knobs():
    source = (PKG / "starter" / "decode_triton.py").read_text()
    assert re.search(r"^BLOCK_N = 16  # knob: 16, 32, 64$", source, re.M)
    assert re.search(r"^\s+num_warps=\d+,$", source, re.M)
    assert re.search(r"^\s+num_stages=\d+,$", source, re.M)
    assert "synchronize" not in source


_TRITON_SCRIPT = textwrap.dedent(
    """
    import os, sys, json, time, importlib.util, tomllib
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    pkg = sys.argv[1]

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    hooks = load("hooks", os.path.join(pkg, "optagent_hooks.py"))
    starter = load("starter", os.path.join(pkg, "starter", "decode_triton.py"))
    with open(os.path.join(pkg, "optagent.toml"), "rb") as f:
        manifest = tomllib.load(f)
    for kind in ("smoke", "hidden"):
        for i, params in enumerate(manifest[kind]):
            args = hooks.make_case(params, "cpu", i)
            ref = hooks.reference(args, torch.float64)[0]
            start = time.perf_counter()
            starter.run_kernel(*args)
            seconds = time.perf_counter() - start
            out = args[3].double()
            err = ((out - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf")
            print(json.dumps({"case": f"{kind}-{i + 1}", "err": err, "seconds": seconds,
                              "describe": hooks.describe(args)}), flush=True)
    """
)


@pytest.fixture(scope="module")
def triton_results():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, str(PKG)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.parametrize("case", CASE_IDS)
def test_triton_starter_matches_reference(triton_results, case):
    result = triton_results[case]
    print(f"{case}: {result['describe']} rel_err={result['err']:.2e} {result['seconds']:.2f}s")
    assert result["err"] < 1e-2


def test_cuda_starter_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    source = PKG / "starter" / "decode_cuda.cu"
    text = source.read_text()
    assert re.search(r'^#define THREADS 128  // knob: 64, 128, 256$', text, re.M)
    assert 'extern "C" void run_kernel(' in text
    assert "cudaDeviceSynchronize" not in text
    lib = tmp_path / "decode.so"
    proc = subprocess.run(
        [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", str(lib), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert lib.stat().st_size > 0
