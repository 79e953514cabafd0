"""Contest-style kernels through the real sandboxed evaluator on Triton's CPU interpreter.

A loop over a runtime-int range (what the contest's starters do) must run, which needs the
numpy range pyproject declares; an fp8 kernel that the interpreter converts wrongly
(triton-lang/triton#8322) is UNSUPPORTED with the reason, never a false INCORRECT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.worker.interpreter_faults import source_uses_fp8
from optagent.schema import Language, Status
from optagent.task import load_task

# The fault is the pinned Triton's (pyproject: triton==3.6.0 in the install line); a fixed
# interpreter passes the judge's probe and the fp8 kernel below then simply PASSES.
FAULTY_TRITON = pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="Triton 3.6's fault")

SUMSQ_CONFIG = '''
import sys
CASES = [(3, 300), (2, 1000)]  # hidden sizes no power of two, so the loop's last block is partial


def getNumOfTestcases():
    return len(CASES)


try:
    import torch
    CURRENT = None

    def getTestCaseSize():
        global CURRENT
        CURRENT = CASES[int(input().strip()) - 1]
        return [CURRENT, CURRENT[:1]], (1, 2)

    def genTestCase(sizes):
        g = torch.Generator().manual_seed(5)
        rows, hidden = CURRENT
        return [torch.randn(rows, hidden, generator=g), torch.empty(rows)]

    def baseline(x, out):
        return [x, (x * x).sum(dim=1)]

    def check(sizes, original, target, ref):
        ok = torch.allclose(target[1], ref[1], rtol=1e-4, atol=1e-4)
        if not ok:
            print("[FAIL] sum of squares mismatch", file=sys.stderr)
        return ok
except Exception:
    pass
'''

# `hidden` is a plain Python int at launch: under the interpreter, range() over it needs numpy < 2.4.
SUMSQ_KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _sumsq(x_ptr, out_ptr, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * hidden + offs, mask=offs < hidden, other=0.0)
        acc += x * x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def run_kernel(x, out):
    rows, hidden = x.shape
    _sumsq[(rows,)](x, out, hidden, BLOCK=128)
'''

QUANT_CONFIG = '''
import sys
CASES = [(4096,)]


def getNumOfTestcases():
    return len(CASES)


try:
    import torch
    CURRENT = None

    def getTestCaseSize():
        global CURRENT
        CURRENT = CASES[int(input().strip()) - 1]
        return [CURRENT, CURRENT, ()], (1, 2)

    def genTestCase(sizes):
        g = torch.Generator().manual_seed(11)
        n = CURRENT[0]
        return [torch.randn(n, generator=g) * 3, torch.empty(n, dtype=torch.float8_e4m3fn), 0.5]

    def baseline(x, out, inv_scale):
        return [x, (x * inv_scale).to(torch.float8_e4m3fn), inv_scale]

    def check(sizes, original, target, ref):
        ok = torch.allclose(target[1].float(), ref[1].float(), rtol=0.125, atol=0.0)  # one e4m3 step
        if not ok:
            print("[FAIL] fp8 quantisation mismatch", file=sys.stderr)
        return ok
except Exception:
    pass
'''

# Correct fp8 (e4m3) quantisation: on an H200 (Triton 3.6) it and its implicit-conversion variant
# below match PyTorch's rounding bit for bit.
QUANT_KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _quant(x_ptr, y_ptr, inv_scale, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, (x * inv_scale).to(tl.float8e4nv), mask=mask)


def run_kernel(x, out, inv_scale):
    n = x.numel()
    _quant[(triton.cdiv(n, 1024),)](x, out, inv_scale, n, BLOCK=1024)
'''


def contest_package(root: Path, title: str, config: str, kernel: str) -> Path:
    """A task package in the contest's format (no optagent manifest), its starter the given kernel."""
    docs = root / "xpuoj_problem" / "en"
    docs.mkdir(parents=True)
    (root / "xpuoj_problem" / "meta.json").write_text(json.dumps({"id": 1, "samples": [{"inputData": "1\n"}]}))
    (root / "xpuoj_problem" / "testcase_config.py").write_text(config)
    (docs / "_title.txt").write_text(title)
    (docs / "00_statement.md").write_text(f'---\nsectionTitle: "Statement"\ntype: "Text"\n---\n{title}\n')
    (docs / "01_contract.triton.md").write_text(
        '---\nsectionTitle: "Contract"\ntype: "codeSample"\nlang: "triton"\n---\n`run_kernel(...)`\n')
    (root / "starter").mkdir()
    (root / "starter" / "kernel.py").write_text(kernel)
    return root


def evaluate(root: Path, kernel: str, cases: str = "1"):
    task = load_task(root)
    n = len(cases.split(","))
    return SandboxEvaluator(task, "cpu", select_cases(task, "cpu", max(n, 2), cases), timeout_s=180).evaluate(
        kernel, Language.TRITON)


@pytest.fixture(scope="module")
def sumsq(tmp_path_factory) -> Path:
    return contest_package(tmp_path_factory.mktemp("sumsq_task_package"), "Row sum of squares", SUMSQ_CONFIG,
                           SUMSQ_KERNEL)


@pytest.fixture(scope="module")
def quant(tmp_path_factory) -> Path:
    return contest_package(tmp_path_factory.mktemp("quant_task_package"), "fp8 quantisation", QUANT_CONFIG,
                           QUANT_KERNEL)


def test_loop_over_a_runtime_int_range_passes(sumsq):
    result = evaluate(sumsq, SUMSQ_KERNEL, "1,2")
    assert result.status is Status.PASSED, result.reason
    assert [c.status for c in result.cases] == [Status.PASSED, Status.PASSED]
    assert all(c.rel_err is not None and c.rel_err < 1e-5 for c in result.cases)


def test_plainly_wrong_kernel_is_still_incorrect(sumsq):
    wrong = SUMSQ_KERNEL.replace("acc += x * x", "acc += x")
    result = evaluate(sumsq, wrong)
    assert result.status is Status.INCORRECT, result.reason
    assert "check() failed" in result.reason and "interpreter" not in result.reason


@FAULTY_TRITON
def test_fp8_kernel_is_unsupported_on_cpu_naming_the_interpreter(quant):
    result = evaluate(quant, QUANT_KERNEL)
    assert result.status is Status.UNSUPPORTED, result.reason
    reason = result.cases[0].reason
    assert reason.startswith("UNSUPPORTED on CPU: Triton ") and "interpreter converts float32 to fp8 wrongly" in reason
    assert "triton-lang/triton#8322" in reason and "check() failed" in reason  # what failed, kept


@FAULTY_TRITON
def test_implicit_fp8_conversion_counts_by_the_tensors(quant):
    # no fp8 type named: the store into the fp8 output converts; the case's fp8 tensor tells the judge
    implicit = QUANT_KERNEL.replace("(x * inv_scale).to(tl.float8e4nv)", "x * inv_scale")
    assert not source_uses_fp8(implicit)
    result = evaluate(quant, implicit)
    assert result.status is Status.UNSUPPORTED and "#8322" in result.reason, result.reason


def test_source_fp8_names():
    assert source_uses_fp8("y = x.to(tl.float8e4nv)") and source_uses_fp8("y = x.to(tl.float8e5)")
    assert source_uses_fp8("torch.float8_e4m3fn") and source_uses_fp8("tl.float8e4b15")
    assert not source_uses_fp8("y = x.to(tl.float16)  # float8 later") and not source_uses_fp8("fp16")


@FAULTY_TRITON
def test_interpreter_probe_finds_the_fault_in_the_pinned_triton():
    # what the judge runs, in a process of its own: TRITON_INTERPRET is read at import
    code = "from optagent.worker.interpreter_faults import fp8_fault; print(fp8_fault())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("Triton 3.6's interpreter converts float32 to fp8 wrongly"), done.stdout
    assert "1.99 -> float8_e4m3fn gives 1, not 2" in done.stdout
