"""Checks every strategy family's tests share: the manifest, the scan and knobs, evaluator verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from optagent.integrity import static_verdict
from optagent.search.knobs import find_knobs, set_knobs
from optagent.search.planners.offline import STRATEGY_ROOT
from optagent.search.strategy_spec import StrategyEntry, StrategySpec, read_spec
from optagent.schema import EvalResult, Language, Status


def family(name: str) -> tuple[Path, StrategySpec, list[StrategyEntry]]:
    """The family's folder, its strategy.toml read by the planner's own schema, and its strategies."""
    folder = STRATEGY_ROOT / name
    spec = read_spec(folder)  # fields, unique names, each file's run_kernel against the signature
    return folder, spec, spec.strategy


def check_manifest(folder: Path, spec: StrategySpec, arity: int) -> None:
    """The folder is the family it names, and its signature has the contest's arity."""
    assert spec.family == folder.name
    assert len(spec.signature) == arity


def check_scan_and_knobs(source: str, language: Language, variants: Iterable[tuple[str, dict]] = ()) -> None:
    """The static scan accepts the source and each knob variant; tunables are declared knobs."""
    assert static_verdict(source, language) is None
    knobs = find_knobs(source)
    assert knobs, "a strategy declares its tunables as knobs"
    for k in knobs:
        assert k.value in k.values, f"{k.name}: the default {k.value} is one of the listed values"
    for label, setting in variants:
        assert static_verdict(set_knobs(source, setting), language) is None, label


def verdict_failures(label: str, result: EvalResult, n_cases: int | None = None) -> list[str]:
    """Why an evaluation is not a clean pass (every case PASSED within tolerance), one line each."""
    if result.status is not Status.PASSED or (n_cases is not None and len(result.cases) != n_cases):
        return [f"{label}: {result.status.value}: {result.reason}"]
    return [f"{label} / {c.case}: {c.status.value} rel_err={c.rel_err} tolerance={c.tolerance}"
            for c in result.cases
            if c.status is not Status.PASSED or c.rel_err is None or c.rel_err >= c.tolerance]


def start_evaluations(pool, task, folder: Path, strategies: list[StrategyEntry],
                      variants: Callable[[str], list[tuple[str, dict, bool]]]) -> dict:
    """{strategy name: [(label, case kinds expected, future EvalResult)]}: each strategy at its
    defaults on the smoke and hidden cases, and each (label, knob setting, with hidden cases)
    variant, submitted to pool so that they run side by side."""
    from optagent.evaluation.evaluator import SandboxEvaluator
    from optagent.evaluation.cases import select_cases
    from optagent.schema import CaseKind

    every = select_cases(task, "cpu", 0, None)
    smoke = select_cases(task, "cpu", 0, None, hidden=False)
    both = {CaseKind.SMOKE, CaseKind.HIDDEN}
    runs = {}
    for s in strategies:
        source = (folder / s.file).read_text(encoding="utf-8")
        language = s.language
        items = [("default", both, pool.submit(SandboxEvaluator(task, "cpu", every, timeout_s=300).evaluate,
                                               source, language))]
        for label, setting, hidden in variants(source):
            cases, kinds = (every, both) if hidden else (smoke, {CaseKind.SMOKE})
            items.append((label, kinds, pool.submit(SandboxEvaluator(task, "cpu", cases, timeout_s=300).evaluate,
                                                    set_knobs(source, setting), language)))
        runs[s.name] = items
    return runs


def evaluation_failures(items: list) -> list[str]:
    """verdict_failures over start_evaluations' items, and cases of the wrong kinds."""
    bad = []
    for label, kinds, future in items:
        result = future.result(timeout=600)
        bad += verdict_failures(label, result)
        if result.status is Status.PASSED and {c.kind for c in result.cases} != kinds:
            bad.append(f"{label}: ran {sorted(c.kind.value for c in result.cases)}")
    return bad
