"""What the compiler reports per kernel: parsing of ptxas -v, cuobjdump -res-usage and Triton's
compiled-kernel metadata (samples written here), nvcc's own report, and the prompt showing it."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from optagent.llm.feedback import kernel_lines
from optagent.schema import CaseKind, CaseResult, Device, EvalResult, KernelFacts, Language, Status
from optagent.worker.compiler_facts import collect, from_triton, occupancy, parse_ptxas, parse_res_usage

ROOT = Path(__file__).resolve().parents[1]

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z12decode_splitPK6__halfS1_PfS2_iii' for 'sm_90a'
ptxas info    : Function properties for _Z12decode_splitPK6__halfS1_PfS2_iii
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 32768 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z7combinePfS_i' for 'sm_90a'
ptxas info    : Function properties for _Z7combinePfS_i
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, 380 bytes cmem[0]
"""

RES_USAGE = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z7combinePfS_i:
  REG:24 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:380 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z12decode_splitPK6__halfS1_PfS2_iii:
  REG:168 STACK:16 SHARED:32768 LOCAL:16 CONSTANT[0]:400 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_ptxas_verbose_output_is_parsed_per_kernel() -> None:
    split, combine = parse_ptxas(PTXAS)
    assert (split.name, split.registers, split.spill_bytes, split.shared_bytes) == (
        "_Z12decode_splitPK6__halfS1_PfS2_iii", 168, 20, 32768)
    assert (combine.registers, combine.spill_bytes, combine.shared_bytes) == (24, 0, 0)
    assert split.occupancy is None  # ptxas does not know the block size
    assert parse_ptxas("nvcc warning: nothing useful") == []


def test_cuobjdump_resource_usage_is_parsed() -> None:
    combine, split = parse_res_usage(RES_USAGE)
    assert (combine.name, combine.registers, combine.shared_bytes) == ("_Z7combinePfS_i", 24, 0)
    assert (split.registers, split.shared_bytes, split.spill_bytes) == (168, 32768, 16)


def test_triton_metadata_dict_gives_registers_spills_shared_and_occupancy() -> None:
    facts = from_triton({"name": "_decode_kernel", "n_regs": 64, "n_spills": 3, "shared": 16384,
                         "num_warps": 4, "num_stages": 2})
    # 64 regs x 32 threads = 2048 per warp: 65536 / (2048 x 4) = 8 blocks by registers, 8 x 4 / 64 warps
    assert (facts.registers, facts.spill_bytes, facts.shared_bytes, facts.warps) == (64, 12, 16384, 4)
    assert facts.occupancy == pytest.approx(0.5)


@pytest.mark.parametrize("regs, smem, warps, expected", [
    (32, 0, 8, 1.0),  # 8 blocks of 8 warps fill the 64
    (255, 0, 4, 0.125),  # 255 -> 8192 per warp: 2 blocks of 4 warps, 8 of 64
    (32, 100 * 1024, 4, 2 * 4 / 64),  # shared memory allows 2 blocks
    (32, 0, None, None),
])
def test_occupancy(regs: int, smem: int, warps, expected) -> None:
    assert occupancy(regs, smem, warps) == (pytest.approx(expected) if expected is not None else None)


def test_collect_reads_the_compiled_kernels_of_a_modules_jit_functions() -> None:
    kernel = SimpleNamespace(n_regs=40, n_spills=0, metadata=SimpleNamespace(
        name="_attn_fwd", shared=8192, num_warps=8, num_stages=3))
    jit = SimpleNamespace(device_caches={0: ({"key": kernel}, {}, None, None, None)})
    backend = SimpleNamespace(module=SimpleNamespace(_attn_fwd=jit, BLOCK=64), kernel_facts=[])
    (facts,) = collect(backend)
    assert (facts.name, facts.registers, facts.shared_bytes, facts.warps, facts.stages) == ("_attn_fwd", 40, 8192, 8, 3)
    assert collect(SimpleNamespace(module=None)) == []
    assert collect(object()) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_builds_report_their_kernels_also_from_the_cache(tmp_path: Path) -> None:
    from optagent.worker.backends.cuda import CudaBackend

    src = tmp_path / "candidate.cu"
    starter = ROOT / "tasks" / "flashattn_task_package" / "starter" / "decode_cuda.cu"
    src.write_text(starter.read_text() + f"// {tmp_path.name}\n")  # a source no earlier build cached
    first = CudaBackend(Device.CPU, None, 300)
    first.prepare(src, tmp_path)
    assert first.kernel_facts and all(k.source == "ptxas" and k.registers for k in first.kernel_facts)
    again = CudaBackend(Device.CPU, None, 300)
    again.prepare(src, tmp_path)
    assert again.library == first.library and again.kernel_facts == first.kernel_facts


def test_the_prompt_shows_what_the_compiler_reports() -> None:
    from test_llm_planner import make_ctx

    from optagent.search.planners.llm import build_messages

    ctx = make_ctx()
    facts = [from_triton({"name": "_decode", "n_regs": 96, "n_spills": 2, "shared": 4096, "num_warps": 4})]
    case = CaseResult(case="1", kind=CaseKind.CONTEST, status=Status.PASSED, time_us=10.0, baseline_us=20.0,
                      kernels=facts + [KernelFacts(name="_decode", source="triton", registers=1)])
    ctx.best_result = EvalResult(status=Status.PASSED, language=Language.TRITON, device="cuda", source_sha256="0" * 64,
                                 cases=[case], wall_s=1.0)
    assert kernel_lines(ctx.best_result) == [
        "_decode (triton): 96 registers, 8 B spilled, 4.0 KiB shared, 4 warps, occupancy 31%"]  # 5 blocks of 4 warps
    prompt = build_messages(ctx)[1]["content"]
    assert "What the compiler reports" in prompt and "- _decode (triton): 96 registers, 8 B spilled" in prompt


def test_a_two_step_cuda_build_keeps_lineinfo_in_the_compile_step():
    from pathlib import Path

    from optagent.schema import Device
    from optagent.worker.backends.cuda import CudaBackend

    b = CudaBackend(Device.CUDA, ["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-lcublas",
                                  "-L/opt/lib", "{arch}", "-o", "{out}", "{src}"], 60.0)
    compile_only = b._command(Path("k.o"), Path("k.cu"), "-arch=sm_90", compile_only=True)
    assert "-lineinfo" in compile_only and "-c" in compile_only and "-shared" not in compile_only
    assert "-lcublas" not in compile_only and "-L/opt/lib" not in compile_only
    from optagent.worker.backends.cuda import is_link_flag
    assert [p for p in b.compiler if is_link_flag(p)] == ["-lcublas", "-L/opt/lib"]


TARGET_SCRIPT = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from optagent.worker import target_compile

target_compile.record_launches()

@triton.jit
def _scaled(x, s):
    return x * s

@triton.jit
def row_sum(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(_scaled(x, scale), axis=0))

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

x = torch.randn(4, 100, dtype=torch.bfloat16)
out = torch.empty(4)
row_sum[(4,)](x, out, 100, 2.0, BLOCK=128, num_warps=2)
first = target_compile.target_facts()
y = torch.zeros(300)
add_one[(triton.cdiv(300, 64),)](y, 300, BLOCK=64)  # launched after the interpreter patched its language
facts = target_compile.target_facts()
out.zero_()
row_sum[(4,)](x, out, 100, 2.0, BLOCK=128, num_warps=2)  # the interpreter still works after the compiles
ok = torch.allclose(out, 2 * x.float().sum(1), rtol=1e-3) and bool((y == 1).all())
print(json.dumps({"first": len(first), "facts": [f.model_dump() for f in facts], "ok": ok}))
'''


def test_cpu_mode_compiles_interpreted_launches_for_the_target(tmp_path):
    """Under Triton's interpreter nothing is compiled, yet the launches seen are compiled for sm_90 (helpers,
    tl.sum and all, before and after the interpreter patched its language), and the interpreter still works."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    script = tmp_path / "kernels.py"  # a file: Triton's compiler reads a jit function's source
    script.write_text(TARGET_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["first"] == 1
    facts = {f["name"]: KernelFacts(**f) for f in got["facts"]}
    assert set(facts) == {"row_sum", "add_one"}
    for f in facts.values():
        assert f.target == "sm_90" and f.source == "triton" and f.registers and f.registers > 0, f
        assert f.spill_bytes == 0 and f.occupancy is not None
    assert facts["row_sum"].warps == 2 and facts["add_one"].warps == 4
    line = kernel_lines(EvalResult(status=Status.PASSED, language=Language.TRITON, device="cpu", source_sha256="0" * 64,
                                   cases=[CaseResult(case="1", kind=CaseKind.SMOKE, status=Status.PASSED,
                                                     kernels=[facts["row_sum"]])], wall_s=1.0))[0]
    assert line.startswith("row_sum (triton, built for sm_90, not run): ") and "registers" in line, line


def test_a_cpu_evaluation_reports_the_starters_facts_for_the_target():
    """End to end, in the sandbox: the decode starter evaluated on CPU carries its kernel's sm_90 facts."""
    from optagent.evaluation.evaluator import SandboxEvaluator
    from optagent.evaluation.cases import select_cases
    from optagent.task import load_task

    task = load_task(ROOT / "tasks" / "flashattn_task_package")
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=False) if c.label == "smoke-1"]
    result = SandboxEvaluator(task, "cpu", cases, target_facts=True).evaluate(task.starter(Language.TRITON).source,
                                                                              Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    (kernel,) = result.cases[0].kernels
    assert kernel.name == "_paged_decode_kernel" and kernel.target == "sm_90" and kernel.registers


def test_a_compile_for_the_target_that_would_not_end_is_cut_off():
    """ptxas on a huge kernel can take minutes: the facts' deadline interrupts the wait (a subprocess here)."""
    import subprocess
    import time

    from optagent.worker.target_compile import _deadline, _Overdue

    start = time.monotonic()
    with pytest.raises(_Overdue):
        with _deadline(0.3):
            subprocess.run(["sleep", "5"])
    assert time.monotonic() - start < 2.0
    time.sleep(0.5)  # and the alarm is gone once the block is left
