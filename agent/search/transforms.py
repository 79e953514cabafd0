"""Transformations that apply to any kernel, not to a family, as mechanical edits of its text.

Each yields (source, idea) for every place it applies and nothing where it does not; it checks
only that the edit is well-formed, never that it is right: the evaluator judges the result like any
other candidate, so an edit that does not fit a kernel fails its step and is not kept.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from optagent.search.discover import Offsets, int_literal, jit_kernels

MAX_ROW_TILE = 16384  # a whole row in one tile up to here; longer rows keep their loop with this tile
ROW_WARPS = 8


def _loop_bounds(fn: ast.FunctionDef) -> dict[str, str]:
    """{constexpr step: the parameter the loop runs to} of ``for i in range(a, END, STEP)`` loops."""
    params = {a.arg for a in fn.args.args}
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and ast.unparse(node.iter.func) in (
                "range", "tl.range", "tl.static_range") and len(node.iter.args) == 3:
            end, step = node.iter.args[1], node.iter.args[2]
            if isinstance(step, ast.Name) and isinstance(end, ast.Name) and end.id in params:
                out[step.id] = end.id
    return out


def _launches(tree: ast.Module, kernels: dict) -> Iterator[tuple[ast.Call, str]]:
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) and f.value.id in kernels:
            yield call, f.value.id


def _arg_for(call: ast.Call, fn: ast.FunctionDef, param: str) -> ast.AST | None:
    names = [a.arg for a in fn.args.args]
    i = names.index(param)
    if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: i + 1]):
        return call.args[i]
    return next((k.value for k in call.keywords if k.arg == param), None)


def whole_row(source: str) -> Iterator[tuple[str, str]]:
    """A tile looped over a row's columns becomes the whole row (next power of two), with more warps:
    one pass over the data per loop instead of many small ones."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    if not re.search(r"^\s*import triton\s*$", source, re.M):
        return
    kernels, at = jit_kernels(tree), Offsets(source)
    fns = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for call, kern in _launches(tree, kernels):
        bounds = _loop_bounds(fns[kern])
        for kw in call.keywords:
            if kw.arg not in bounds or int_literal(kw.value) is None:
                continue
            end = _arg_for(call, fns[kern], bounds[kw.arg])
            grid = ast.unparse(call.func.slice)  # type: ignore[attr-defined]
            if end is None or str(int_literal(kw.value)) in grid:  # a tile the grid divides by is no row loop
                continue
            edits = [(*at.span(kw.value), f"min(triton.next_power_of_2({ast.unparse(end)}), {MAX_ROW_TILE})")]
            warps = next((k for k in call.keywords if k.arg == "num_warps"), None)
            if warps is not None and int_literal(warps.value) is not None:
                edits.append((*at.span(warps.value), str(max(ROW_WARPS, int_literal(warps.value) or 0))))
            elif warps is None:
                close = at(call.end_lineno, call.end_col_offset) - 1  # type: ignore[arg-type]
                edits.append((close, close, f", num_warps={ROW_WARPS}"))
            out = source
            for start, stop, text in sorted(edits, reverse=True):
                out = out[:start] + text + out[stop:]
            yield out, (f"whole row per tile: {kw.arg} = next_power_of_2({ast.unparse(end)}) "
                        f"(at most {MAX_ROW_TILE}), num_warps {ROW_WARPS}")


def add_num_warps(source: str) -> Iterator[tuple[str, str]]:
    """A launch without num_warps gets one, so that the warps become a knob searched with its tile."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    kernels, at = jit_kernels(tree), Offsets(source)
    for call, kern in _launches(tree, kernels):
        if any(k.arg in ("num_warps", None) for k in call.keywords):
            continue
        close = at(call.end_lineno, call.end_col_offset) - 1  # type: ignore[arg-type]
        yield source[:close] + ", num_warps=8" + source[close:], f"launch {kern} with num_warps=8 (was the default 4)"


def autotune_single(source: str) -> Iterator[tuple[str, str]]:
    """Each triton.autotune config alone: the same kernel without the tuning at its first call."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    at = Offsets(source)
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in
                 ("triton.autotune", "autotune")):
        configs = next((k.value for k in call.keywords if k.arg == "configs"), call.args[0] if call.args else None)
        if not isinstance(configs, ast.List) or len(configs.elts) < 2:
            continue
        start, end = at.span(configs)
        for i, c in enumerate(configs.elts):
            text = source[slice(*at.span(c))]
            yield source[:start] + f"[{text}]" + source[end:], f"autotune config {i + 1} of {len(configs.elts)} alone"


KERNEL_SIG = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?\w+\s*\(([^)]*)\)")
POINTER = re.compile(r"(\*)(?!\s*__restrict__)(\s*)(?=\w+\s*(?:,|$))")


def cuda_restrict(source: str) -> Iterator[tuple[str, str]]:
    """``__restrict__`` on every pointer parameter of the __global__ kernels: the compiler may then
    read the inputs through the read-only cache and keep loads in flight across stores."""
    out, pos, changed = [], 0, False
    for m in KERNEL_SIG.finditer(source):
        params = m.group(1)
        new = ",".join(POINTER.sub(r"\1 __restrict__\2", p) for p in params.split(","))
        if new != params:
            changed = True
            out += [source[pos:m.start(1)], new]
            pos = m.end(1)
    if changed:
        yield "".join(out) + source[pos:], "__restrict__ on the kernels' pointer parameters"


def transforms(source: str, cuda: bool) -> Iterator[tuple[str, str]]:
    if cuda:
        yield from cuda_restrict(source)
        return
    yield from whole_row(source)
    yield from autotune_single(source)
    yield from add_num_warps(source)
