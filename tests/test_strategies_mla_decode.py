"""The mla_decode strategy library: format, integrity scan, and correctness on CPU.

Each Triton strategy goes through the sandboxed evaluator on CPU (Triton's
interpreter in a worker process): at its default knobs on the package's smoke
and hidden cases (ragged lengths, sequences ending mid-page and one token
long, pages of 16, garbage rows of norm ~1e4 wherever no sequence may read);
with every knob at its smallest value and at its largest on the smoke cases;
and split as finely as the knobs allow on every case, so that the merge of
many partials, splits past a short sequence's end and splits of a single tile
are all checked against the float64 reference.  Under the interpreter the
strategy plans for 4 SMs: at the defaults the smoke cases fit one split (the
direct path); the all-min and finest-split variants go through the merge.
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

TASK = Path(__file__).resolve().parents[1] / "tasks" / "mla_decode_task_package"
FAMILY, SPEC, STRATEGIES = family("mla_decode")
TRITON = [s for s in STRATEGIES if s.language is Language.TRITON]
FINEST = {"BLOCK_N": 16, "BLOCK_N_16": 16, "MIN_TILES": 1, "PROGRAMS_PER_SM": 8}  # the most splits, one tile each


def _variants(source: str) -> list[tuple[str, dict, bool]]:
    """(label, knob setting, on the hidden cases too)."""
    knobs = {k.name: k for k in find_knobs(source)}
    return [("all-min", {n: min(k.values) for n, k in knobs.items()}, False),
            ("all-max", {n: max(k.values) for n, k in knobs.items()}, False),
            ("finest split", {n: v for n, v in FINEST.items() if n in knobs}, True)]


@pytest.fixture(scope="module")
def task():
    return load_task(TASK)


@pytest.fixture(scope="module")
def evaluations(task):
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield start_evaluations(pool, task, FAMILY, TRITON, _variants)


def test_strategy_manifest_lists_existing_files_with_the_contest_signature(task):
    assert SPEC.family == "mla_decode" == task.manifest.family
    assert SPEC.signature == run_kernel_params(task.starter(Language.TRITON).source)
    check_manifest(FAMILY, SPEC, 13)
    params = run_kernel_params(task.starter(Language.TRITON).source)
    assert {s.name for s in load_strategies(Language.TRITON, task.manifest.family, params)} >= {s.name for s in TRITON}


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_passes_the_integrity_scan_and_declares_knobs(strategy):
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    check_scan_and_knobs(source, strategy.language, [(label, st) for label, st, _ in _variants(source)])


@pytest.mark.parametrize("strategy", TRITON, ids=lambda s: s.name)
def test_triton_strategy_passes_the_evaluator_at_default_and_knob_extremes(strategy, evaluations):
    bad = evaluation_failures(evaluations[strategy.name])
    assert not bad, "\n".join(bad)
