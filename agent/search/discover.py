"""Knobs no one declared: launch-configuration literals of Triton and CUDA kernels.

Triton: a ``tl.constexpr`` parameter given as a literal at the launch (``kern[grid](..., BLOCK=128)``),
literal grid sizes of persistent launches (``kern[(132,)]``) and the entries of ``triton.Config``
dicts. CUDA: the block-size literal of ``<<<grid, 256>>>``, literal template arguments at the launch
(``kern<64><<<...>>>``) and ``constexpr int`` sizes. A literal the grid derives from the tile
(``triton.cdiv(n, 128)``, ``(n + 255) / 256``) moves with it, and so does a ``__launch_bounds__``
of the same value, so that changing a knob keeps the launch covering the data.

Ranges come from the value's role, bounded by the hardware: threads per block 32..1024, warps 1..16,
stages 1..5, tiles from an eighth of the value to 64 times it, at most 2**16 elements.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator, Optional

MAX_THREADS = 1024
MAX_TILE = 1 << 16
MIN_GRID_LITERAL = 8  # a grid of 1..7 programs is the kernel's design, not a persistent grid to size


@dataclass(frozen=True)
class Found:
    name: str
    value: int
    values: tuple[int, ...]
    spans: tuple[tuple[int, int, int], ...]  # (start, end, offset): the literal there becomes value + offset
    group: Optional[str] = None  # the launch it belongs to: knobs of one launch interact


def pow2_range(v: int, lo: int, hi: int) -> tuple[int, ...]:
    if v <= 0 or v & (v - 1):
        return (v,)
    out, x = [], 1
    while x <= hi:
        if x >= lo:
            out.append(x)
        x *= 2
    return tuple(sorted(set(out) | {v}))


def role_values(name: str, v: int) -> tuple[int, ...]:
    """The values worth trying for a size named name, now v."""
    n = name.upper()
    if "THREAD" in n:
        return pow2_range(v, 32, MAX_THREADS)
    if "WARP" in n:
        return pow2_range(v, 1, 16)
    if "STAGE" in n:
        return tuple(range(1, 6)) if v <= 5 else (v,)
    if re.search(r"BLOCK|TILE|CHUNK", n):
        return pow2_range(v, max(1, v // 8), min(MAX_TILE, v * 64))
    return pow2_range(v, max(1, v // 4), v * 4)


class Offsets:
    """ast positions (line, UTF-8 byte column) to character offsets in the source."""

    def __init__(self, source: str):
        self.starts, pos = [], 0
        for line in source.splitlines(keepends=True):
            self.starts.append((pos, line))
            pos += len(line)

    def __call__(self, lineno: int, col: int) -> int:
        start, line = self.starts[lineno - 1]
        return start + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self(node.lineno, node.col_offset), self(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def int_literal(node: ast.AST) -> Optional[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def jit_kernels(tree: ast.Module) -> dict[str, set[str]]:
    """@triton.jit functions and their tl.constexpr parameters."""
    out: dict[str, set[str]] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list}
        if not names & {"triton.jit", "jit", "triton.autotune", "autotune"}:
            continue
        out[fn.name] = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                        if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")}
    return out


def _grid_nodes(call: ast.Call, fn: Optional[ast.FunctionDef]) -> list[ast.AST]:
    """The grid expression of a launch, and its definition when it is a name assigned in the function."""
    grid = call.func.slice  # type: ignore[attr-defined]
    nodes = [grid]
    if isinstance(grid, ast.Name) and fn is not None:
        nodes += [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == grid.id for t in a.targets)]
    return nodes


def triton_knobs(source: str) -> list[Found]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    kernels, at = jit_kernels(tree), Offsets(source)
    found: list[Found] = []
    owner = {id(n): f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in kernels:
            kern = func.value.id
            grid_ints = [n for g in _grid_nodes(call, owner.get(id(call))) for n in ast.walk(g) if int_literal(n) is not None]
            used: set[int] = set()
            for kw in call.keywords:
                v = int_literal(kw.value)
                if kw.arg in kernels[kern] and v is not None:
                    spans = [(*at.span(kw.value), 0)]
                    for g in grid_ints:  # the grid's copy of the tile: cdiv(n, 128), (n + 127) // 128
                        gv = int_literal(g)
                        if id(g) not in used and gv in (v, v - 1) and v > 2:
                            spans.append((*at.span(g), -1 if gv == v - 1 else 0))
                            used.add(id(g))
                    found.append(Found(kw.arg, v, role_values(kw.arg, v), tuple(spans), group=kern))
                elif kw.arg in ("num_warps", "num_stages") and v is not None:  # found by knobs.py; grouped here
                    found.append(Found(kw.arg, v, (v,), ((*at.span(kw.value), 0),), group=kern))
            for g in grid_ints:
                gv = int_literal(g)
                if id(g) not in used and gv is not None and gv >= MIN_GRID_LITERAL:
                    found.append(Found(f"grid@{kern}", gv, tuple(sorted({gv // 2, gv, gv * 2})),
                                       ((*at.span(g), 0),), group=kern))
        elif ast.unparse(func) in ("triton.Config", "Config") and call.args and isinstance(call.args[0], ast.Dict):
            for key, val in zip(call.args[0].keys, call.args[0].values):
                v = int_literal(val)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and v is not None:
                    found.append(Found(f"config.{key.value}", v, role_values(key.value, v),
                                       ((*at.span(val), 0),), group=f"config@{call.lineno}"))
    return found


CU_LAUNCH = re.compile(r"(?P<kern>\b\w+)\s*(?:<(?P<targs>[^<>;]*)>)?\s*<<<\s*(?P<grid>[^,;]+?)\s*,"
                       r"\s*(?P<block>[^,;>]+?)\s*(?:,[^;>]*)?>>>")
CU_CONSTEXPR = re.compile(r"\b(?:static\s+)?constexpr\s+(?:int|unsigned|int32_t|int64_t|size_t)\s+"
                          r"(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>\d+)\s*;")
LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\(\s*(\d+)")
NUMBER = re.compile(r"\b\d+\b")


def _literal(text: str) -> Optional[int]:
    return int(text) if text.isdigit() else None


def cuda_knobs(source: str) -> list[Found]:
    found: list[Found] = []
    bounds = [(m.start(1), m.end(1), int(m.group(1))) for m in LAUNCH_BOUNDS.finditer(source)]
    counts: dict[str, int] = {}
    for m in CU_LAUNCH.finditer(source):
        kern = m.group("kern")
        counts[kern] = counts.get(kern, 0) + 1
        tag = kern if counts[kern] == 1 else f"{kern}#{counts[kern]}"
        block = _literal(m.group("block"))
        spans: list[tuple[int, int, int]] = []
        if block is not None:
            spans.append((m.start("block"), m.end("block"), 0))
            for g in NUMBER.finditer(m.group("grid")):  # (n + 255) / 256
                gv = int(g.group())
                if gv in (block, block - 1) and block > 2:
                    spans.append((m.start("grid") + g.start(), m.start("grid") + g.end(), -1 if gv == block - 1 else 0))
            spans += [(s, e, 0) for s, e, v in bounds if v == block]
        targs = m.group("targs")
        if targs is not None:
            pos = m.start("targs")
            for i, t in enumerate(targs.split(",")):
                lead = len(t) - len(t.lstrip())
                tv = _literal(t.strip())
                if tv is not None and tv == block:
                    spans.append((pos + lead, pos + lead + len(t.strip()), 0))  # kern<64><<<g, 64>>>: one size
                elif tv is not None:
                    found.append(Found(f"template{i}@{tag}", tv, role_values("BLOCK", tv),
                                       ((pos + lead, pos + lead + len(t.strip()), 0),), group=tag))
                pos += len(t) + 1
        if block is not None:
            found.append(Found(f"threads@{tag}", block, pow2_range(block, 32, MAX_THREADS), tuple(spans), group=tag))
    for m in CU_CONSTEXPR.finditer(source):
        name, v = m.group("name"), int(m.group("value"))
        if re.search(r"BLOCK|TILE|THREAD|WARP|STAGE|CHUNK|UNROLL|VEC|ROWS|ITEMS", name, re.I):
            found.append(Found(name, v, role_values(name, v), ((m.start("value"), m.end("value"), 0),)))
    return found


def discovered(source: str, cuda: bool) -> Iterator[Found]:
    yield from cuda_knobs(source) if cuda else triton_knobs(source)
