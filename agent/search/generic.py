"""What the offline planner tries on a kernel it has no strategy for: the generic transformations,
then joint moves of the knobs of one launch, then a pattern search over every knob.

The pattern search tries, per knob, the next value up and the next down from the best kernel's
value; the best kernel moves when one wins, so a knob walks as far as it keeps gaining, and a
direction ends at the first value that does not win (the planner skips what was tried). Knobs are
taken in the order of how much they usually matter: those of the launch of the kernel that does the
most work first (where run_kernel launches several: a zero-fill beside the real kernel is not worth
the first candidates), then tiles and threads, then warps, then the rest.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional

from optagent.schema import Language
from optagent.search.knobs import Knob, find_all_knobs, set_knobs
from optagent.search.transforms import transforms

Candidate = tuple[str, str, dict]


def _rank(k: Knob) -> int:
    n = k.name.upper()
    if k.name.startswith("threads@") or any(w in n for w in ("BLOCK", "TILE", "THREAD", "CHUNK")):
        return 0
    if "WARP" in n:
        return 1
    if n.startswith("GRID@"):
        return 2
    return 3


WORK = re.compile(r"\b(tl\.load|tl\.store|tl\.dot|tl\.atomic_\w+|for|while|tl\.sum|tl\.max|tl\.min|"
                  r"__syncthreads|__shfl\w*)\b|\[[^\]=]*\]\s*=[^=]")


def kernel_work(source: str, name: str) -> int:
    """A static measure of the work the kernel `name` does per program: its loads, stores, reductions
    and loops, a loop counting as much as what it holds again. A guess from the text, where no GPU
    timing of each launch is at hand: a two-line zero-fill weighs less than the kernel beside it."""
    m = re.search(rf"(?:def|__global__[^(]*?)\s{re.escape(name)}\s*[(<]", source)
    if not m:
        return 0
    rest = source[m.end():]
    nxt = re.search(r"^(?:@triton|def |__global__|extern|template)", rest, re.M)
    body = rest[:nxt.start()] if nxt else rest
    loops = len(re.findall(r"\b(for|while)\b", body))
    return len(WORK.findall(body)) * (1 + loops)


def _by_work(best: str, knobs: list[Knob]) -> dict[Optional[str], int]:
    """Each launch's kernel_work; a knob of no launch (a module constant) counts as the heaviest's."""
    work = {k.group: kernel_work(best, k.group.split("@", 1)[-1]) for k in knobs if k.group}
    return {**work, None: max(work.values(), default=0)}


def _step(k: Knob, direction: int) -> int | None:
    """The next listed value of k in direction (+1 up, -1 down), or None at the end of its range."""
    ordered = sorted(set(k.values))
    i = ordered.index(k.value) + direction
    return ordered[i] if 0 <= i < len(ordered) else None


def _moved(k: Knob, factor: float) -> int | None:
    target = k.value * factor
    return int(target) if int(target) in k.values and int(target) != k.value else None


def joint_moves(best: str, knobs: list[Knob]) -> Iterator[Candidate]:
    """A larger tile wants more warps: the tile and the warps of one launch doubled (or halved) together."""
    groups: dict[str, list[Knob]] = {}
    for k in knobs:
        if k.group:
            groups.setdefault(k.group, []).append(k)
    for members in groups.values():
        tiles = [k for k in members if _rank(k) == 0]
        warps = [k for k in members if k.name.startswith("num_warps")]
        for tile in tiles:
            for w in warps:
                for factor in (2.0, 0.5):
                    tv, wv = _moved(tile, factor), _moved(w, factor)
                    if tv is not None and wv is not None:
                        setting = {tile.name: tv, w.name: wv}
                        yield (set_knobs(best, setting), f"joint: {tile.name} {tile.value} -> {tv} with "
                               f"{w.name} {w.value} -> {wv}", {"knobs": setting})


def pattern_moves(best: str, knobs: list[Knob]) -> Iterator[Candidate]:
    for k in sorted(knobs, key=_rank):
        for direction in (1, -1):
            v = _step(k, direction)
            if v is not None:
                yield set_knobs(best, {k.name: v}), f"knob {k.name}: {k.value} -> {v}", {"knobs": {k.name: v}}


def generic_candidates(best: str, language: Language) -> Iterator[Candidate]:
    """Every generic candidate for the best kernel, in the order they are worth trying."""
    cuda = language is Language.CUDA
    for source, idea in transforms(best, cuda):
        yield source, f"transform: {idea}", {"transform": idea.split(":")[0]}
    knobs = find_all_knobs(best)
    work = _by_work(best, knobs)
    heavy = max(work.values(), default=0)
    first = [k for k in knobs if work[k.group] >= heavy]  # the launches of the kernel that does the most work
    rest = [k for k in knobs if work[k.group] < heavy]
    for part in (first, rest):
        yield from joint_moves(best, part)
        yield from pattern_moves(best, part)
