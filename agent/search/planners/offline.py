"""The built-in planner for runs without an LLM: strategies, then knob search.

Stateless by design, so a resumed run continues the same search: the next
proposal is derived from the current best kernel and the set of sources
already tried (both in the PlannerContext).

1. Strategies: the task package's own ``strategies/`` folder, then proven kernels
   from ``agent/search/strategies/<family>/`` for the task's family (or run_kernel
   signature), in the run's language, each at its default
   knobs, then at a few spread-out knob settings (successive halving keeps
   the better half of the strategies for that second round).
2. Generic candidates for the best kernel (search/generic.py): transformations that fit any
   kernel, joint moves of a launch's tile and warps, a pattern search over every knob, the
   undeclared launch literals included; a package without strategies starts here.
3. Knob search around the kernel given (the slot's parent: the best kernel, or another
   passing one in a round wider than 1): one knob at a time, every listed value
   (coordinate descent), nearest values first. A round takes the next K settings.

With memory across runs (PlannerContext.memory, search/memory.py), the first candidate is the
best kernel earlier runs kept on this bench (device, device name, language, cases), and a kernel
they measured there is skipped (the next proposal's idea says how many were).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from optagent.search.generic import generic_candidates
from optagent.search.knobs import find_knobs, set_knobs
from optagent.runs.memory import describe_bench
from optagent.search.strategy_spec import StrategySpec, read_spec
from optagent.protocols import PlannerExhausted
from optagent.runs.view import PlannerContext
from optagent.schema import Language, PlannerKind, Proposal

STRATEGY_ROOT = Path(__file__).resolve().parent.parent / "strategies"


@dataclass
class Strategy:
    name: str
    language: Language
    idea: str
    source: str


def _usable(folder: Path, spec: StrategySpec, language: Language) -> list[Strategy]:
    return [Strategy(s.name, language, s.idea, (folder / s.file).read_text(encoding="utf-8"))
            for s in spec.strategy if s.language is language and s.gpu_checked]


def load_strategies(language: Language, family: Optional[str], params: list[str],
                    root: Path = STRATEGY_ROOT, package: Optional[Path] = None) -> list[Strategy]:
    """The package's own strategies (its ``strategies/`` folder), then the built-in ones of its
    family or signature. The package's come first: they are its author's kernels for exactly this
    task, and a later strategy must beat an earlier one by more than the noise to replace it."""
    found = _usable(package, read_spec(package), language) if package is not None else []
    for toml_path in sorted(root.glob("*/strategy.toml")):
        spec = read_spec(toml_path.parent)
        if spec.offered_to(family, params):
            found += _usable(toml_path.parent, spec, language)
    return found


def sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def spread_settings(source: str, count: int = 3) -> list[dict[str, int]]:
    """A few knob settings far from the default: each knob's extremes, one knob at a time."""
    out = []
    for k in find_knobs(source):
        for v in (min(k.values), max(k.values)):
            if v != k.value:
                out.append({k.name: v})
    return out[:count]


class OfflinePlanner:
    name = PlannerKind.OFFLINE
    model: Optional[str] = None

    def __init__(self, language: Language, family: Optional[str], params: list[str],
                 package_strategies: Optional[Path] = None):
        self.language = language
        self.strategies = load_strategies(language, family, params, package=package_strategies)

    def propose(self, ctx: PlannerContext) -> Proposal:
        got = self.propose_round([ctx])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def propose_round(self, ctxs: list[PlannerContext]) -> list[Union[Proposal, Exception]]:
        """The next setting for each slot, from its parent (ctx.best_source), none proposed twice in a round."""
        taken: set[str] = set()
        return [self._next(ctx, taken) for ctx in ctxs]

    def _next(self, ctx: PlannerContext, taken: set[str]) -> Union[Proposal, Exception]:
        tried = {sha(ctx.starter_source), sha(ctx.best_source)} | taken
        times: dict[str, float] = {}
        for a in ctx.attempts:
            if a.source is not None:
                tried.add(sha(a.source))
                if a.result is not None and a.result.geomean_time_us:
                    times[sha(a.source)] = a.result.geomean_time_us
        memory = ctx.memory
        known = memory.best if memory else None
        if known is not None and sha(known.source) not in tried:  # start from what earlier runs reached
            taken.add(sha(known.source))
            e = known.entry
            return Proposal(source=known.source, idea=f"best known from run {e.run_id} step {e.step} "
                            f"({e.speedup:.3g}x on {describe_bench(e.bench)})",
                            meta={"known_best": {"run_id": e.run_id, "step": e.step}})
        # kernels earlier runs measured on this bench are not measured again; their times rank strategies
        measured = memory.measured if memory else {}
        for h, entry in measured.items():
            if entry.geomean_time_us:
                times.setdefault(h, entry.geomean_time_us)
        skipped = 0
        for source, idea, meta in self._candidates(ctx, times):
            h = sha(source)
            if h in tried:
                continue
            if h in measured:
                tried.add(h)
                skipped += 1
                continue
            if skipped:
                idea += f" ({skipped} setting(s) before it skipped: measured by earlier runs)"
                meta = {**meta, "skipped_measured": skipped}
            taken.add(h)
            return Proposal(source=source, idea=idea, meta=meta)
        return PlannerExhausted("every strategy and every knob neighbour of the kernels given was tried" + (
            f" ({skipped} of them by earlier runs on {describe_bench(memory.bench)})" if skipped else ""))

    def _candidates(self, ctx: PlannerContext, times: dict[str, float]) -> Iterator[tuple[str, str, dict]]:
        for s in self.strategies:
            yield s.source, f"strategy {s.name}: {s.idea}", {"strategy": s.name}
        # Successive halving: the better half of the strategies that ran get a second round.
        ranked = sorted((times[sha(s.source)], s) for s in self.strategies if sha(s.source) in times)
        for _, s in ranked[: max(1, (len(ranked) + 1) // 2)] if ranked else []:
            for setting in spread_settings(s.source):
                desc = ", ".join(f"{k}={v}" for k, v in setting.items())
                yield set_knobs(s.source, setting), f"strategy {s.name} with {desc}", {"strategy": s.name, "knobs": setting}
        yield from generic_candidates(ctx.best_source, self.language)
        yield from self._neighbours(ctx.best_source)

    def _neighbours(self, best: str) -> Iterator[tuple[str, str, dict]]:
        for k in find_knobs(best):
            for v in sorted(k.values, key=lambda v: abs(v - k.value)):
                if v == k.value:
                    continue
                yield set_knobs(best, {k.name: v}), f"knob {k.name}: {k.value} -> {v}", {"knobs": {k.name: v}}
