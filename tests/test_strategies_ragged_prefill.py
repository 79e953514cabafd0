"""The ragged_prefill strategy library: format, integrity scan, and correctness on CPU.

Every Triton strategy goes through the sandboxed evaluator on CPU (Triton's
interpreter in a worker process): at its default knobs on the package's smoke
and hidden cases (ragged lengths, chunked prefill with kv longer than qo,
bidirectional attention, GQA/MQA, garbage past the last sequence's keys, an
output pre-filled with NaN), and on the smoke cases with every knob at its
smallest listed value, every knob at its largest, and the smallest query block
with the largest key block (so each knob's extremes are covered, and both
BLOCK_M > BLOCK_N and BLOCK_M < BLOCK_N on the causal diagonal).  The
evaluations are started together in a module fixture so the file stays fast on
two cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from optagent.search.knobs import find_knobs
from optagent.search.planners.offline import load_strategies
from optagent.search.strategy_spec import run_kernel_params
from optagent.schema import Language
from optagent.task import load_task

from strategy_checks import check_manifest, check_scan_and_knobs, evaluation_failures, family, start_evaluations

TASK = Path(__file__).resolve().parents[1] / "tasks" / "ragged_prefill_task_package"
FAMILY, SPEC, STRATEGIES = family("ragged_prefill")
TRITON = [s for s in STRATEGIES if s.language is Language.TRITON]


def _variants(source: str) -> list[tuple[str, dict, bool]]:
    """All knobs at their smallest values, all at their largest, and the smallest BLOCK_M with the
    largest BLOCK_N, on the smoke cases: (label, knob setting, with hidden cases)."""
    knobs = {k.name: k for k in find_knobs(source)}
    out = [("all-min", {n: min(k.values) for n, k in knobs.items()}, False),
           ("all-max", {n: max(k.values) for n, k in knobs.items()}, False)]
    if "BLOCK_M" in knobs and "BLOCK_N" in knobs:
        out.append(("BLOCK_M-min/BLOCK_N-max", {"BLOCK_M": min(knobs["BLOCK_M"].values),
                                                "BLOCK_N": max(knobs["BLOCK_N"].values)}, False))
    return out


@pytest.fixture(scope="module")
def task():
    return load_task(TASK)


@pytest.fixture(scope="module")
def evaluations(task):
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield start_evaluations(pool, task, FAMILY, TRITON, _variants)


def test_strategy_manifest_lists_existing_files_with_the_contest_signature(task):
    assert SPEC.family == "ragged_prefill" == task.manifest.family
    assert SPEC.signature == run_kernel_params(task.starter(Language.TRITON).source)
    check_manifest(FAMILY, SPEC, 13)


def test_offline_planner_finds_the_strategies_for_the_task(task):
    params = run_kernel_params(task.starter(Language.TRITON).source)
    found = load_strategies(Language.TRITON, task.manifest.family, params)
    assert {s.name for s in found} >= {s.name for s in TRITON}


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_passes_the_integrity_scan_and_declares_knobs(strategy):
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    check_scan_and_knobs(source, strategy.language, [(label, st) for label, st, _ in _variants(source)])


@pytest.mark.parametrize("strategy", TRITON, ids=lambda s: s.name)
def test_triton_strategy_passes_the_evaluator_at_default_and_knob_extremes(strategy, evaluations):
    bad = evaluation_failures(evaluations[strategy.name])
    assert not bad, "\n".join(bad)
