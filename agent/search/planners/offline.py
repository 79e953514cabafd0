"""The built-in planner for runs without an LLM: strategies, then knob search.

Stateless by design, so a resumed run continues the same search: the next
proposal is derived from the current best kernel and the set of sources
already tried (both in the PlannerContext).

1. Strategies: proven kernels from ``agent/search/strategies/<family>/`` for the
   task's family (or run_kernel signature) and language, each at its default
   knobs, then at a few spread-out knob settings (successive halving keeps
   the better half of the strategies for that second round).
2. Knob search around the best kernel: one knob at a time, every listed value
   (coordinate descent), nearest values first.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from optagent.search.knobs import find_knobs, set_knobs
from optagent.protocols import PlannerContext, PlannerExhausted
from optagent.schema import Language, PlannerKind, Proposal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

STRATEGY_ROOT = Path(__file__).resolve().parent.parent / "strategies"
SIGNATURE = re.compile(r"def\s+run_kernel\s*\(([^)]*)\)|run_kernel\s*\(([^)]*)\)\s*\{", re.S)


@dataclass
class Strategy:
    name: str
    language: Language
    idea: str
    source: str


def run_kernel_params(source: str) -> list[str]:
    m = SIGNATURE.search(source)
    if not m:
        return []
    names = []
    for raw in (m.group(1) or m.group(2)).split(","):
        raw = re.sub(r"#.*", "", raw).split("=")[0].split(":")[0].strip()
        if raw:
            names.append(re.split(r"[\s*&]+", raw)[-1])
    return names


def load_strategies(language: Language, family: Optional[str], params: list[str],
                    root: Path = STRATEGY_ROOT) -> list[Strategy]:
    found = []
    for toml_path in sorted(root.glob("*/strategy.toml")):
        spec = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        same_family = family is not None and spec.get("family") == family
        same_signature = bool(params) and spec.get("signature") == params
        if not (same_family or same_signature):
            continue
        for s in spec.get("strategy", []):
            # a strategy whose last change has not yet run on a GPU stays out of runs (a hang
            # would cost a run its candidate timeout); its tests and bench/ still use it
            if s.get("language") == language.value and s.get("gpu_checked", True):
                source = (toml_path.parent / s["file"]).read_text(encoding="utf-8")
                found.append(Strategy(s["name"], language, s.get("idea", s["name"]), source))
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

    def __init__(self, language: Language, family: Optional[str], params: list[str]):
        self.language = language
        self.strategies = load_strategies(language, family, params)

    def propose(self, ctx: PlannerContext) -> Proposal:
        tried = {sha(ctx.starter_source), sha(ctx.best_source)}
        times: dict[str, float] = {}
        for a in ctx.attempts:
            if a.source is not None:
                tried.add(sha(a.source))
                if a.result is not None and a.result.geomean_time_us:
                    times[sha(a.source)] = a.result.geomean_time_us
        for source, idea, meta in self._candidates(ctx, times):
            if sha(source) not in tried:
                return Proposal(source=source, idea=idea, meta=meta)
        raise PlannerExhausted("every strategy and every knob neighbour of the best kernel was tried")

    def _candidates(self, ctx: PlannerContext, times: dict[str, float]) -> Iterator[tuple[str, str, dict]]:
        for s in self.strategies:
            yield s.source, f"strategy {s.name}: {s.idea}", {"strategy": s.name}
        # Successive halving: the better half of the strategies that ran get a second round.
        ranked = sorted((times[sha(s.source)], s) for s in self.strategies if sha(s.source) in times)
        for _, s in ranked[: max(1, (len(ranked) + 1) // 2)] if ranked else []:
            for setting in spread_settings(s.source):
                desc = ", ".join(f"{k}={v}" for k, v in setting.items())
                yield set_knobs(s.source, setting), f"strategy {s.name} with {desc}", {"strategy": s.name, "knobs": setting}
        yield from self._neighbours(ctx.best_source)

    def _neighbours(self, best: str) -> Iterator[tuple[str, str, dict]]:
        for k in find_knobs(best):
            for v in sorted(k.values, key=lambda v: abs(v - k.value)):
                if v == k.value:
                    continue
                yield set_knobs(best, {k.name: v}), f"knob {k.name}: {k.value} -> {v}", {"knobs": {k.name: v}}
