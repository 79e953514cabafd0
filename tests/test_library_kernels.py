"""A library's kernels instead of the candidate's: "has its own kernel" is read from the code (a docstring,
a comment or a local `jit` is no kernel), and on the CPU the dispatch watch covers every checked call and
the buffers an input may be laundered into."""

from __future__ import annotations


import pytest

from attack_fixtures import attack_source  # tests/ is on sys.path
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.integrity import has_own_kernel, static_verdict
from optagent.schema import Language, Status
from optagent.task import load_task



@pytest.mark.parametrize("name", ["local_jit", "docstring_kernel"])
def test_a_kernel_named_only_in_text_or_by_a_local_jit_is_no_kernel(name):
    assert static_verdict(attack_source(name), Language.TRITON) == "defines no triton kernel of its own"


def test_own_kernel_is_read_from_the_code():
    assert has_own_kernel("import triton\n@triton.jit\ndef k(x):\n    pass\n", Language.TRITON)
    assert has_own_kernel("from triton import jit\n@jit\ndef k(x):\n    pass\n", Language.TRITON)
    assert has_own_kernel("import triton\n@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k(x):\n    pass\n",
                          Language.TRITON)
    assert has_own_kernel("import tilelang.language as T\n@T.prim_func\ndef k(A):\n    pass\n", Language.TILELANG)
    assert not has_own_kernel('"""@triton.jit"""\nimport triton\n# @triton.jit\n', Language.TRITON)
    assert not has_own_kernel("import triton\ndef jit(f):\n    return f\n@jit\ndef k(x):\n    pass\n", Language.TRITON)
    assert has_own_kernel('extern "C" __global__ void k(float* x) {}', Language.CUDA)
    assert not has_own_kernel('// __global__\n/* __global__ */ const char* s = "__global__";', Language.CUDA)


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


@pytest.mark.parametrize("name", ["launder_copy", "later_calls_torch"])
def test_pytorch_behind_a_copy_or_after_the_first_call_is_caught(task, name):
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=False) if c.label == "smoke-1"]
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=120, static_scan=False).evaluate(attack_source(name),
                                                                                            Language.TRITON)
    assert result.status is Status.REJECTED and "computes with PyTorch on its inputs" in (result.reason or ""), \
        (result.status, result.reason)
