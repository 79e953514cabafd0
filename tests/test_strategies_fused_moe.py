"""The fused_moe strategy library: format, integrity scan, and correctness on CPU.

Every strategy goes through the sandboxed evaluator (Triton's CPU interpreter):
at its default knobs on the package's smoke and hidden cases, and with its
knobs at their smallest and at their largest values on the smoke cases.  The
tile knobs of one regime only change the code path when that regime is chosen,
and the smoke cases (a few tokens) all fall in the decode regime, so the knobs
are set a regime at a time (all at the minimum, or all at the maximum) together
with the threshold that selects that regime: seven evaluations instead of one
per knob extreme, which keeps the file near a minute on a two-core machine.
Knobs that are only launch options (num_warps, num_stages) change nothing the
interpreter computes and are left to the GPU.  The evaluations run two at a
time, with the fewest timing repetitions for the variants.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.messages import TimingSpec
from optagent.search.knobs import find_knobs, set_knobs
from optagent.search.strategy_spec import run_kernel_params
from optagent.schema import CaseKind, Language
from optagent.task import load_task

from strategy_checks import check_manifest, check_scan_and_knobs, family, verdict_failures

TASK_DIR = Path(__file__).resolve().parents[1] / "tasks" / "fused_moe_task_package"
FAMILY, SPEC, STRATEGIES = family("fused_moe")
TRITON = [s for s in STRATEGIES if s.language is Language.TRITON]

# Each tunable knob belongs to the regime whose tiles it sets (first matching prefix); the
# variants set all knobs of a regime to their smallest, or all to their largest, value at
# once, with the threshold that puts the smoke cases (1-2 rows per expert) in that regime.
REGIMES = {
    "decode": ("SMALL_BLOCK", "MAX_SPLIT_K", "GROUP_M", "ROUTE_CHUNK"),
    "mid": ("MID_", "BLOCK_K"),
    "big": ("BIG_",),
}
FORCE = {"decode": {}, "mid": {"SMALL_ROWS": 0}, "big": {"LARGE_ROWS": 0}}
# The thresholds' largest values leave every smoke case in the decode regime.
THRESHOLDS_AT_MAX = ("SMALL_ROWS", "LARGE_ROWS")
LAUNCH_ONLY = ("WARPS", "STAGES")
# Extra variant: K tiles of 64 so that a 128-wide intermediate is split along K, run on
# the hidden cases too (top-1 and empty experts through the split-K combine).
SPLIT_K = {"SMALL_BLOCK_K": 64, "MAX_SPLIT_K": 8}


def _tunable(source: str):
    return [k for k in find_knobs(source) if not (k.name.endswith(LAUNCH_ONLY) or k.name.startswith("num_"))]


def _variants(source: str) -> list[tuple[str, dict, bool]]:
    """(label, knob setting, with hidden cases)."""
    knobs = _tunable(source)
    out = []
    for regime, prefixes in REGIMES.items():
        mine = [k for k in knobs if k.name.startswith(prefixes)]
        for pick, extreme in ((min, "min"), (max, "max")):
            setting = {**FORCE[regime], **{k.name: pick(k.values) for k in mine}}
            if regime == "decode" and extreme == "max":
                setting.update({k.name: max(k.values) for k in knobs if k.name in THRESHOLDS_AT_MAX})
            out.append((f"{regime} knobs at {extreme}", setting, False))
    out.append(("split-K", dict(SPLIT_K), True))
    return out


def test_variants_cover_every_tunable_knob_at_both_extremes():
    source = (FAMILY / TRITON[0].file).read_text(encoding="utf-8")
    settings = [s for _, s, _ in _variants(source)]
    for k in _tunable(source):
        for v in (min(k.values), max(k.values)):
            assert any(s.get(k.name) == v for s in settings), f"{k.name}={v} is never run"


@pytest.fixture(scope="module")
def task():
    return load_task(TASK_DIR)


def test_strategy_manifest_lists_existing_files_with_the_contest_signature(task):
    assert SPEC.family == "fused_moe" == task.manifest.family
    starter = (TASK_DIR / "starter" / "moe_triton.py").read_text(encoding="utf-8")
    assert SPEC.signature == run_kernel_params(starter)
    check_manifest(FAMILY, SPEC, 11)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_passes_the_integrity_scan_and_declares_knobs(strategy):
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    check_scan_and_knobs(source, strategy.language, [(label, st) for label, st, _ in _variants(source)])


@pytest.mark.parametrize("strategy", TRITON, ids=lambda s: s.name)
def test_triton_strategy_passes_the_evaluator_at_default_and_knob_extremes(strategy, task, monkeypatch):
    # two workers side by side, one core each (the environment variable reaches the workers)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    source = (FAMILY / strategy.file).read_text(encoding="utf-8")
    every = select_cases(task, "cpu", 0, None)
    smoke = [c for c in every if c.kind is CaseKind.SMOKE]
    assert smoke and len(every) > len(smoke)
    runs = [("default", source, every, False)]
    for label, setting, hidden in _variants(source):
        runs.append((label, set_knobs(source, setting), every if hidden else smoke, True))

    def evaluate(run):
        label, src, cases, quick = run
        ev = SandboxEvaluator(task, "cpu", cases, timeout_s=300)
        if quick:  # correctness only: one timed call per case
            ev.timing = TimingSpec(min_iters=1, max_iters=1, budget_s=0.0, input_sets=1, warmup=0)
        return label, cases, ev.evaluate(src, Language.TRITON)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(evaluate, runs))
    bad = []
    for label, cases, result in results:
        bad += verdict_failures(label, result, len(cases))
    assert not bad, "\n".join(bad)
