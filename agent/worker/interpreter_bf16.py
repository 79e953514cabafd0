"""Triton's CPU interpreter and bf16: it keeps bf16 values as their raw 16-bit patterns, and three faults
follow, each probed on a few known values and repaired in this process only where the probe finds it
(a fixed Triton is left alone); worker/interpreter_faults.py installs them and blames what is left.

- ``tl.dot``: the operands' patterns were multiplied as integers (a 16x64 @ 64x32 dot off by 8e9):
  widened to float32 first, which is exact for bf16 inputs.
- float32 -> bf16: truncated, where a GPU rounds to nearest even: rounded.
- elementwise math: sums, comparisons, min/max, clamps and fma on the patterns (bf16 1.0 + 1.0 gave
  1.7e38, ``x > -inf`` was false), and no bf16 constant for ``tl.full``: computed in float32 and each
  result rounded back to bf16, as PyTorch and a GPU do.

Imports torch and triton only inside its functions (the orchestrator never imports them).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional


def _dot_probe_error() -> Optional[float]:
    """The relative error of a bf16 16x64 @ 64x32 tl.dot under the interpreter (None: it cannot run)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        a = tl.load(a_ptr + m[:, None] * K + k[None, :])
        b = tl.load(b_ptr + k[:, None] * N + n[None, :])
        tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=gen).to(torch.bfloat16)
    b = torch.randn(64, 32, generator=gen).to(torch.bfloat16)
    c = torch.empty(16, 32, dtype=torch.float32)
    try:
        _dot[(1,)](a, b, c, M=16, N=32, K=64)
    except Exception:
        return None
    ref = a.double() @ b.double()
    return float((c.double() - ref).norm() / ref.norm())


DOT_TOLERANCE = 1e-5  # float32 accumulation of exact bf16 products: ~1e-7 relative


@lru_cache(maxsize=1)
def bf16_dot_fault() -> Optional[str]:
    """What the installed interpreter gets wrong in a bf16 tl.dot (probed before any repair), or None."""
    import triton

    err = _dot_probe_error()
    if err is None or err <= DOT_TOLERANCE:
        return None
    return (f"Triton {'.'.join(triton.__version__.split('.')[:2])}'s interpreter multiplies bf16 tl.dot "
            f"operands as their raw 16-bit patterns (a bf16 16x64 @ 64x32 dot is off by a relative {err:.1e})")


@lru_cache(maxsize=1)
def repair_bf16_dot() -> Optional[str]:
    """Repairs the interpreter's bf16 tl.dot in this process where the probe finds it wrong; the
    fault's text when a repair is in place, None when there was nothing to repair. Raises nothing:
    a repair that does not take is undone and the fault stays for ``blame_interpreter`` to report."""
    fault = bf16_dot_fault()
    if fault is None:
        return None
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def widened(handle):
        if handle.dtype.scalar == tl.bfloat16:  # stored as uint16 bit patterns: bf16 -> f32 is a shift
            bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    err = _dot_probe_error()
    if err is None or err > DOT_TOLERANCE:
        builder.create_dot = original
        return None
    return fault


def _rounding_probe() -> Optional[int]:
    """How many of 256 float32 values the interpreter's float32 -> bf16 store rounds unlike PyTorch (None:
    the probe cannot run)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _round(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))

    x = torch.randn(256, generator=torch.Generator().manual_seed(1))
    y = torch.empty(256, dtype=torch.bfloat16)
    try:
        _round[(1,)](x, y, N=256)
    except Exception:
        return None
    return int((y != x.to(torch.bfloat16)).sum())


@lru_cache(maxsize=1)
def bf16_rounding_fault() -> Optional[str]:
    """What the installed interpreter gets wrong rounding float32 to bf16 (probed before any repair), or None."""
    import triton

    wrong = _rounding_probe()
    if not wrong:
        return None
    return (f"Triton {'.'.join(triton.__version__.split('.')[:2])}'s interpreter truncates float32 -> bf16 "
            f"instead of rounding to nearest even ({wrong} of 256 values differ from PyTorch's)")


def _bf16_nearest_even(values):
    """float32 values -> their bf16 bit patterns (uint16), rounded to nearest, ties to even; NaN stays NaN."""
    import numpy as np

    f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out.reshape(f32.shape)


@lru_cache(maxsize=1)
def repair_bf16_rounding() -> Optional[str]:
    """Makes the interpreter's default float32 -> bf16 conversion round to nearest even where the probe finds
    it truncating; the fault's text when the repair is in place, else None (as repair_bf16_dot)."""
    fault = bf16_rounding_fault()
    if fault is None:
        return None
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    rtne = interpreter._ir.ROUNDING_MODE.RTNE

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode in (None, rtne):
            return _bf16_nearest_even(input)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert
    if _rounding_probe() != 0:
        interpreter._convert_float = original
        return None
    return fault


def _math_probe() -> Optional[str]:
    """What the interpreter gets wrong in bf16 elementwise math (a sum, a comparison, a bf16 constant), or None;
    the exception's text where the probe cannot run at all."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _math(x_ptr, s_ptr, g_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        floor = tl.full([N], float("-inf"), tl.bfloat16)
        tl.store(s_ptr + offs, x + x)
        tl.store(g_ptr + offs, (x > floor).to(tl.int32))

    x = torch.tensor([1.0, -2.0, 3.0, 0.5, -0.25, 7.0, 100.0, -1e-3], dtype=torch.bfloat16)
    s, g = torch.empty_like(x), torch.empty(8, dtype=torch.int32)
    try:
        _math[(1,)](x, s, g, N=8)
    except Exception as e:  # Triton 3.6: the builder has no get_bf16 (tl.full of bf16)
        return str(e).split("\n")[0][:160]
    if not torch.equal(s, x + x):
        return "a bf16 sum is computed on the values' raw 16-bit patterns"
    if not bool(g.all()):
        return "a bf16 comparison is made on the values' raw 16-bit patterns"
    return None


@lru_cache(maxsize=1)
def bf16_math_fault() -> Optional[str]:
    """What the installed interpreter gets wrong in bf16 elementwise math (probed before any repair), or None."""
    import triton

    wrong = _math_probe()
    if wrong is None:
        return None
    return f"Triton {'.'.join(triton.__version__.split('.')[:2])}'s interpreter holds bf16 as raw 16-bit patterns ({wrong})"


@lru_cache(maxsize=1)
def repair_bf16_math() -> Optional[str]:
    """Elementwise math on bf16 (arithmetic, comparisons, min/max, clamps, fma, unary functions, bf16 constants)
    computed in float32 and rounded back to nearest even, as a GPU does, where the probe finds it wrong; the
    fault's text when the repair is in place, else None (as repair_bf16_dot)."""
    fault = bf16_math_fault()
    if fault is None:
        return None
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    saved = {name: builder.__dict__.get(name) for name in ("binary_op", "ternary_op", "unary_op", "create_fma",
                                                           "get_bf16")}

    def is_bf16(h) -> bool:
        return getattr(getattr(h, "dtype", None), "scalar", None) == tl.bfloat16

    def wide(h):
        if not is_bf16(h):
            return h
        bits = np.ascontiguousarray(h.data).view(np.uint16).astype(np.uint32) << 16
        return handle(bits.view(np.float32).reshape(np.shape(h.data)), tl.float32)

    def narrow(out):
        if out.dtype == np.bool_:
            return handle(out.astype(np.uint16), tl.bfloat16)  # as the builder labels a bf16 comparison
        return handle(_bf16_nearest_even(out), tl.bfloat16)

    def binary_op(self, lhs, rhs, op):
        if not (is_bf16(lhs) or is_bf16(rhs)) or not is_bf16(lhs):
            return saved["binary_op"](self, lhs, rhs, op)
        return narrow(np.asarray(op(wide(lhs).data, wide(rhs).data)))

    def ternary_op(self, lhs, rhs, other, op):
        if not is_bf16(other):
            return saved["ternary_op"](self, lhs, rhs, other, op)
        return narrow(np.asarray(op(wide(lhs).data, wide(rhs).data, wide(other).data)))

    def unary_op(self, arg, op):
        if not is_bf16(arg):
            return saved["unary_op"](self, arg, op)
        return narrow(np.asarray(op(wide(arg).data)))

    def create_fma(self, x, y, z):
        if not is_bf16(z):
            return saved["create_fma"](self, x, y, z)
        return narrow(np.asarray(wide(x).data * wide(y).data + wide(z).data))

    def get_bf16(self, value):
        return handle(_bf16_nearest_even(np.array([value], dtype=np.float32)), tl.bfloat16)

    repaired = {"binary_op": binary_op, "ternary_op": ternary_op, "unary_op": unary_op, "create_fma": create_fma,
                "get_bf16": get_bf16}
    for name, fn in repaired.items():
        setattr(builder, name, fn)
    # the create_* lambdas call self.binary_op etc. by name: they pick the repaired ones up
    if _math_probe() is not None:
        for name, fn in saved.items():
            if fn is None:
                delattr(builder, name)
            else:
                setattr(builder, name, fn)
        return None
    return fault
