"""Tunable knobs of a kernel source: found, declared, and substituted textually.

Declared knobs list their values::

    BLOCK_N = 64  # knob: 16, 32, 64, 128          (Python)
    #define THREADS 128  // knob: 64, 128, 256      (CUDA)

and may end in a note after the values (``# knob: 1, 2, 4 (tokens per step)``).

Undeclared ones are found: literal ``num_warps=``/``num_stages=`` launch
arguments, power-of-two module constants and ``#define``s whose names say they
are sizes (BLOCK, TILE, SPLIT, WARPS, THREADS, STAGES...), tried at half and
double their value. ``find_all_knobs`` adds the launch literals that discover.py finds, with
ranges from each value's role (the generic search uses them; strategies keep to find_knobs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from optagent.search.discover import discovered, role_values

SIZE_NAME = re.compile(r"BLOCK|TILE|SPLIT|WARP|THREAD|STAGE|CHUNK|PAGES|GROUP|UNROLL|VEC", re.I)
# Sizes the hardware fixes, not the kernel: changing them breaks a correct kernel.
HARDWARE = re.compile(r"^(WARP_?SIZE|WARP_?THREADS|LANES_PER_WARP|THREADS_PER_WARP|SMEM_BANKS?)$")
# The value list may be followed by a note: "# knob: 16, 32, 64 (rows per program)".
VALUES = r"(?P<values>\d+(?:[ \t]*,[ \t]*\d+)*)[ \t]*,?(?:[ \t]+[^\d\s,].*)?$"  # one line: no \s
PY_DECLARED = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)\s*=\s*(?P<value>\d+)\s*#\s*knob:\s*" + VALUES, re.M)
CU_DECLARED = re.compile(r"^\s*#\s*define\s+(?P<name>[A-Z][A-Z0-9_]*)\s+(?P<value>\d+)\s*//\s*knob:\s*" + VALUES, re.M)
PY_CONST = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)\s*=\s*(?P<value>\d+)\s*$", re.M)
CU_DEFINE = re.compile(r"^\s*#\s*define\s+(?P<name>[A-Z][A-Z0-9_]*)\s+(?P<value>\d+)\s*$", re.M)
LAUNCH_KW = re.compile(r"\b(?P<name>num_warps|num_stages)\s*=\s*(?P<value>\d+)\b")
LAUNCH_VALUES = {"num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3, 4]}


@dataclass(frozen=True)
class Knob:
    name: str
    value: int
    values: tuple[int, ...]
    start: int  # span of the value literal in the source
    end: int
    # further literals that move with it, (start, end, offset): the grid's cdiv(n, 128) of a BLOCK=128
    also: tuple[tuple[int, int, int], ...] = ()
    group: Optional[str] = None  # the launch it configures: knobs of one launch are searched jointly
    declared: bool = False


def _pow2_neighbours(v: int) -> tuple[int, ...]:
    if v <= 0 or v & (v - 1):
        return (v,)
    return tuple(x for x in (v // 2, v, v * 2) if x >= 1)


def find_knobs(source: str) -> list[Knob]:
    knobs: dict[str, Knob] = {}
    for pattern in (PY_DECLARED, CU_DECLARED):
        for m in pattern.finditer(source):
            values = tuple(int(x) for x in m.group("values").replace(",", " ").split())
            knobs[m.group("name")] = Knob(m.group("name"), int(m.group("value")), values, *m.span("value"),
                                          declared=True)
    for pattern in (PY_CONST, CU_DEFINE):
        for m in pattern.finditer(source):
            name = m.group("name")
            if name in knobs or not SIZE_NAME.search(name) or HARDWARE.match(name):
                continue
            v = int(m.group("value"))
            knobs[name] = Knob(name, v, _pow2_neighbours(v), *m.span("value"))
    seen: dict[str, int] = {}
    for m in LAUNCH_KW.finditer(source):
        # Several launches may each set num_warps; number them so each is its own knob.
        base = m.group("name")
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}#{seen[base]}"
        v = int(m.group("value"))
        values = tuple(sorted(set(LAUNCH_VALUES[base]) | {v}))
        knobs[name] = Knob(name, v, values, *m.span("value"))
    return sorted(knobs.values(), key=lambda k: k.start)


def find_all_knobs(source: str) -> list[Knob]:
    """find_knobs, undeclared sizes over their role's range, and the launch literals no one declared."""
    cuda = "__global__" in source
    knobs = {k.name: k if k.declared or k.name.startswith("num_") else replace(k, values=role_values(k.name, k.value))
             for k in find_knobs(source)}
    by_start = {k.start: k for k in knobs.values()}
    for f in discovered(source, cuda):
        (start, end, _), *also = f.spans
        if start in by_start:  # num_warps=, found above: only its launch is new
            k = by_start[start]
            knobs[k.name] = replace(k, group=f.group)
            continue
        name = f.name if f.name not in knobs else f"{f.name}#{sum(n.split('#')[0] == f.name for n in knobs) + 1}"
        knobs[name] = Knob(name, f.value, f.values, start, end, tuple(also), f.group)
        by_start[start] = knobs[name]
    return sorted(knobs.values(), key=lambda k: k.start)


def set_knobs(source: str, values: dict[str, int]) -> str:
    """The source with the named knobs set (and the literals that move with them); unknown names are an error."""
    knobs = {k.name: k for k in find_all_knobs(source)}
    unknown = set(values) - set(knobs)
    if unknown:
        raise KeyError(f"no knob(s) {', '.join(sorted(unknown))} in the source")
    edits: dict[int, tuple[int, str]] = {}
    for name, v in values.items():
        k = knobs[name]
        for start, end, offset in ((k.start, k.end, 0), *k.also):
            edits[start] = (end, str(v + offset))
    out = source
    for start in sorted(edits, reverse=True):
        end, text = edits[start]
        out = out[:start] + text + out[end:]
    return out

