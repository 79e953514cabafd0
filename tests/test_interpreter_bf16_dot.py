"""Bf16 tl.dot on Triton's CPU interpreter: repaired in the worker, so a decode kernel is judged.

Triton 3.6's interpreter multiplies bf16 dot operands as their uint16 bit patterns. The worker
widens them to float32 first (interpreter_bf16.repair_bf16_dot, installed only where the probe
finds the fault): a correct bf16 decode kernel passes, a wrong one still fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.app.build import build_evaluator
from optagent.schema import Device, Language, Status
from optagent.task import load_task
from optagent.worker.interpreter_faults import source_uses_dot

DECODE = Path(__file__).resolve().parents[1] / "tasks" / "mla_decode_task_package"
STARTER = (DECODE / "starter" / "mla_triton.py").read_text()
FAULTY_TRITON = pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="Triton 3.6's fault")

# The starter with its tiles kept in bf16: the products are bf16 tl.dot (what a GPU kernel does),
# the scale applied to the scores instead of the queries.
BF16 = (STARTER
        .replace("    q_nope = q_nope.to(tl.float32) * sm_scale\n    q_pe = q_pe.to(tl.float32) * sm_scale\n", "")
        .replace("mask=mask_n[:, None], other=0.0).to(tl.float32)", "mask=mask_n[:, None], other=0.0)")
        .replace("s = tl.dot(q_nope, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe.to(tl.float32)))",
                 "s = (tl.dot(q_nope, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe))) * sm_scale")
        .replace("tl.dot(p, c)", "tl.dot(p.to(c.dtype), c)"))
WRONG = BF16.replace(" + tl.dot(q_pe, tl.trans(k_pe))", "")  # the rotary part of the scores dropped


def evaluate(kernel: str):
    task = load_task(DECODE)
    return SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 1, "1"), timeout_s=300).evaluate(
        kernel, Language.TRITON)


def test_the_variants_are_what_they_claim():
    assert BF16 != STARTER and "to(tl.float32)" not in BF16.split("def _mla_decode_kernel")[1].split("out =")[0]
    assert WRONG != BF16 and source_uses_dot(BF16) and not source_uses_dot("x = a @ b  # dotted")


@FAULTY_TRITON
def test_probe_finds_the_fault_and_the_repair_fixes_it():
    code = ("from optagent.worker import interpreter_bf16 as f\n"
            "print(f.bf16_dot_fault()); print(f.repair_bf16_dot() is not None); print(f._dot_probe_error())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    fault, repaired, err = done.stdout.strip().split("\n")
    assert fault.startswith("Triton 3.6's interpreter multiplies bf16 tl.dot operands as their raw 16-bit"), fault
    assert repaired == "True" and float(err) < 1e-5


def test_a_correct_bf16_dot_decode_kernel_passes_on_cpu():
    result = evaluate(BF16)
    assert result.status is Status.PASSED, result.reason
    assert result.cases[0].rel_err is not None and result.cases[0].rel_err < result.cases[0].tolerance


def test_a_wrong_bf16_dot_decode_kernel_fails_on_cpu():
    result = evaluate(WRONG)
    assert result.status is Status.INCORRECT, result.reason
    assert "interpreter" not in (result.reason or "")


ADD_LN = Path(__file__).resolve().parent / "fixtures" / "packages" / "add_layernorm"


@FAULTY_TRITON
def test_probe_finds_the_truncating_bf16_store_and_the_repair_rounds_to_nearest_even():
    code = ("from optagent.worker import interpreter_bf16 as b, interpreter_faults as f\n"
            "print(b.bf16_rounding_fault()); print(len(f.repair_interpreter())); print(b._rounding_probe())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    fault, repaired, wrong = done.stdout.strip().split("\n")
    assert fault.startswith("Triton 3.6's interpreter truncates float32 -> bf16"), fault
    assert repaired == "3" and wrong == "0"  # the dot's, the rounding's and bf16 math's (below)


def test_an_exact_bf16_residual_sum_passes_on_cpu():
    # the package's check() wants h == PyTorch's bf16 x + residual exactly: a truncating store failed it
    task = load_task(ADD_LN)
    starter = task.starter(Language.TRITON).source
    evaluator = build_evaluator(task, Device.CPU, None)  # the package's smoke case, as a CPU run derives it
    result = evaluator.evaluate(starter, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    wrong = starter.replace("(x + r).to(tl.bfloat16)", "(x + r + 0.01).to(tl.bfloat16)")
    bad = evaluator.evaluate(wrong, Language.TRITON)
    assert bad.status is Status.INCORRECT and "h = x + residual mismatch" in bad.reason, bad.reason


BF16_MATH = r'''
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from optagent.worker import interpreter_bf16 as b, interpreter_faults as f

fault = b.bf16_math_fault()
repaired = f.repair_interpreter()

@triton.jit
def running_max(x_ptr, best_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    # a greedy-argmax with its running maximum kept in bf16 (what a model wrote, and lost to the interpreter)
    best = tl.full([BLOCK], float("-inf"), tl.bfloat16)
    best_i = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
        better = x > best
        best = tl.where(better, x, best)
        best_i = tl.where(better, offs, best_i)
    m = tl.max(best, axis=0)
    tl.store(best_ptr, m)
    tl.store(idx_ptr, tl.min(tl.where(best == m, best_i, n), axis=0))

@triton.jit
def axpy(x_ptr, y_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x, y = tl.load(x_ptr + offs), tl.load(y_ptr + offs)
    tl.store(o_ptr + offs, x * y + 0.5 - tl.minimum(x, y))

gen = torch.Generator().manual_seed(3)
x = torch.randn(1000, generator=gen).to(torch.bfloat16)
best, idx = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.int32)
running_max[(1,)](x, best, idx, 1000, BLOCK=64)
a, b = torch.randn(64, generator=gen).to(torch.bfloat16), torch.randn(64, generator=gen).to(torch.bfloat16)
o = torch.empty(64, dtype=torch.bfloat16)
axpy[(1,)](a, b, o, N=64)
want = (a * b + 0.5) - torch.minimum(a, b)  # PyTorch's bf16: each step in float32, rounded to bf16
print(json.dumps({"fault": fault, "repaired": repaired, "max": float(best), "want_max": float(x.max()),
                  "idx": int(idx), "want_idx": int(x.float().argmax()),
                  "same": bool(torch.equal(o, want))}))
'''


@FAULTY_TRITON
def test_bf16_elementwise_math_is_repaired_on_the_interpreter(tmp_path):
    """Triton 3.6's interpreter adds and compares bf16 values as their raw 16-bit patterns and has no bf16
    constant: a model's bf16 running maximum failed on the CPU alone. Computed in float32 and rounded back."""
    import json

    script = tmp_path / "bf16_math_probe.py"  # a file: Triton reads a jit function's source
    script.write_text(BF16_MATH)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fault"] and "raw 16-bit patterns" in got["fault"] and len(got["repaired"]) == 3
    assert got["max"] == got["want_max"] and got["idx"] == got["want_idx"]
    assert got["same"]  # each step rounded to bf16 as PyTorch (and a GPU) does
