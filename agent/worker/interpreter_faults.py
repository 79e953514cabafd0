"""Known faults of Triton's CPU interpreter, so that a CPU verdict does not blame a correct kernel.

On CPU every kernel runs under TRITON_INTERPRET. Where the interpreter itself computes
wrongly, a failed check says nothing about the kernel: the judge (trusted; it never loads
the candidate) tries the installed interpreter on a few known values, and a case that
failed, involves what the fault breaks and ran on a faulty interpreter is UNSUPPORTED,
its reason naming the fault. A fixed Triton passes the probe and gets honest verdicts.

Fp8: Triton 3.6's interpreter rounds float32 (and bf16/fp16) -> fp8 wrongly
(triton-lang/triton#8322): ties go away from zero and a carry out of the mantissa is
dropped, so 1.99 -> e4m3 gives 1.0, not 2.0. The conversion is often implicit (a store
into an fp8 pointer, ``p.to(v.dtype)`` with fp8 ``v``), so a case counts as fp8 when
the source names an fp8 type or any of its tensors is fp8.

Bf16: the same interpreter keeps bf16 values as raw 16-bit patterns; its three faults that follow
(``tl.dot``, float32 -> bf16 rounding, elementwise math) are repaired, not blamed
(worker/interpreter_bf16.py), so the kernel is judged: ``repair_interpreter`` installs every repair,
in the candidate process before any candidate code exists, and in the judge.

This module imports torch and triton only inside the judge's functions: the
orchestrator, which reads sources, never imports torch.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional

from optagent.messages import Finding
from optagent.worker.interpreter_bf16 import bf16_dot_fault, repair_bf16_dot, repair_bf16_math, repair_bf16_rounding
from optagent.schema import Status

# Triton's fp8 types (tl.float8e4nv, ...), PyTorch's (torch.float8_e4m3fn, ...) and the fp8e* type strings.
FP8_NAME = re.compile(r"\bfloat8(?:e4nv|e4b15|e4b8|e5|e5b16)\b|\bfloat8_e[45]m[23]\w*|\bfp8e[45]\w*")
ISSUE = "triton-lang/triton#8322"
DOT_CALL = re.compile(r"\bdot\s*\(")


def source_uses_fp8(source: str) -> bool:
    return FP8_NAME.search(source) is not None


def has_fp8_tensors(args: list) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() == 1 for a in args)


def source_uses_dot(source: str) -> bool:
    return DOT_CALL.search(source) is not None


def has_bf16_tensors(args: list) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)


@lru_cache(maxsize=1)
def fp8_fault() -> Optional[str]:
    """What the installed interpreter gets wrong converting float32 to fp8, or None if nothing."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _convert(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(y_ptr.dtype.element_ty))

    # a carry into the exponent (1.99, 3.99, 0.499), a tie to even (1.0625), and exact values
    x = torch.tensor([1.99, -3.99, 0.499, 1.0625, 1.25, 0.0, -1.0, 2.0], dtype=torch.float32)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        y = torch.empty(x.numel(), dtype=dtype)
        try:
            _convert[(1,)](x, y, N=x.numel())
        except Exception:  # an interpreter that cannot run the probe proves nothing either way
            return None
        got, want = y.float(), x.to(dtype).float()
        wrong = (got != want).nonzero()
        if len(wrong):
            i = int(wrong[0])
            return (f"Triton {'.'.join(triton.__version__.split('.')[:2])}'s interpreter converts float32 to fp8 "
                    f"wrongly ({ISSUE}: {float(x[i]):g} -> {str(dtype).replace('torch.', '')} gives "
                    f"{float(got[i]):g}, not {float(want[i]):g})")
    return None


def repair_interpreter() -> list[str]:
    """Every known fault of the installed interpreter that this process repaired (candidate process, judge)."""
    return [f for f in (repair_bf16_dot(), repair_bf16_rounding(), repair_bf16_math()) if f]


def dot_fault_left() -> Optional[str]:
    """The bf16 tl.dot fault where this process could not repair it (the judge's question)."""
    fault = bf16_dot_fault()
    return fault if fault is not None and repair_bf16_dot() is None else None


def blame_interpreter(finding: Finding, source_fp8: bool, args: list, source_dot: bool = False) -> Finding:
    """A CPU case's INCORRECT finding as UNSUPPORTED where a known interpreter fault explains it."""
    if finding.status is not Status.INCORRECT:
        return finding
    if source_dot and has_bf16_tensors(args):
        left = dot_fault_left()
        if left is not None:
            return finding.model_copy(update={
                "status": Status.UNSUPPORTED,
                "reason": f"UNSUPPORTED on CPU: {left}, so this bf16 tl.dot kernel cannot be checked here; "
                          f"evaluate it on a GPU (the check said: {finding.reason})"})
    if not (source_fp8 or has_fp8_tensors(args)):
        return finding
    fault = fp8_fault()
    if fault is None:
        return finding
    return finding.model_copy(update={
        "status": Status.UNSUPPORTED,
        "reason": f"UNSUPPORTED on CPU: {fault}, so this fp8 kernel cannot be checked here; evaluate it on a "
                  f"GPU (the check said: {finding.reason})"})
