"""Every case sees a freshly loaded kernel, as in the contest (one process per case)."""

from __future__ import annotations

import importlib.util

import pytest

from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.schema import Language, Status
from optagent.task import load_task

# A kernel in the style of the seed's TileLang starter: it builds its launch
# configuration once per process, for the first shape it sees.
FIRST_SHAPE_CACHE = '''
_FIRST = None


def run_kernel(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, batch_size, seqlen_k,
               seqlen_q, num_heads, num_heads_k, headdim, page_block_size, num_blocks, causal):
    global _FIRST
    if _FIRST is None:
        _FIRST = (batch_size, num_heads, num_heads_k, headdim)
    batch_size, num_heads, num_heads_k, headdim = _FIRST
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, batch_size, seqlen_k,
            seqlen_q, num_heads, num_heads_k, headdim, page_block_size, num_blocks, causal)
'''


def test_kernel_caching_its_first_shape_passes_every_case(task_dir):
    task = load_task(task_dir)
    starter = task.starter(Language.TRITON).source
    source = starter.replace("def run_kernel(", "def _launch(", 1) + FIRST_SHAPE_CACHE
    cases = select_cases(task, "cpu", 0, None, hidden=False)
    shapes = {tuple(sorted(c.params.items())) for c in cases}
    assert len(shapes) > 1  # the smoke cases differ in shape, so a shared module would fail
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=300).evaluate(source, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    assert all(c.load_ms is not None for c in result.cases)


def test_tilelang_without_a_gpu_or_tilelang_is_unsupported_with_the_reason(seed_dir):
    task = load_task(seed_dir)
    source = task.starter(Language.TILELANG).source
    result = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 12, "1"), timeout_s=120).evaluate(
        source, Language.TILELANG)
    assert result.status is Status.UNSUPPORTED
    want = "TileLang is not installed" if importlib.util.find_spec("tilelang") is None else "need a CUDA GPU"
    assert want in (result.reason or ""), result.reason


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="TileLang is not installed")
def test_gpu_seed_tilelang_starter_passes_cases_of_different_shapes(seed_dir):
    """Its kernel is built once per process for the first shape: only fresh loads let case 12 pass after case 1."""
    task = load_task(seed_dir)
    cases = select_cases(task, "cuda", 12, "1,12", hidden=False)
    result = SandboxEvaluator(task, "cuda", cases, timeout_s=600).evaluate(task.starter(Language.TILELANG).source,
                                                                          Language.TILELANG)
    assert result.status is Status.PASSED, result.reason
    assert [c.status for c in result.cases] == [Status.PASSED, Status.PASSED]
