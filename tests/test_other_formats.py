"""Packages in the contest format that differ from the decode one in ways the format allows:
no optagent manifest, genTestCase without a device parameter, a baseline that returns new
tensors instead of writing in place, a float scalar argument, a Markdown starter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optagent.evaluation.evaluator import SandboxEvaluator, probe_task
from optagent.evaluation.cases import select_cases
from optagent.schema import Language, Status
from optagent.task import load_task

CONFIG = '''
import sys
CASES = [(1000,), (4099,)]


def getNumOfTestcases():
    return len(CASES)


try:
    import torch
    CURRENT = None

    def getTestCaseSize():
        global CURRENT
        CURRENT = CASES[int(input().strip()) - 1]
        return [CURRENT, CURRENT, CURRENT, ()], (2, 5)

    def genTestCase(sizes):  # no device parameter: the harness moves the tensors
        g = torch.Generator().manual_seed(7)
        n = CURRENT[0]
        return [torch.randn(n, generator=g), torch.randn(n, generator=g), torch.empty(n), 0.5]

    def baseline(x, y, out, alpha):
        return [x, y, x + alpha * y, alpha]  # returns the result rather than writing out

    def check(sizes, original, target, ref, rtol=1e-5, atol=1e-5):
        ok = torch.allclose(target[2], ref[2], rtol=rtol, atol=atol)
        if not ok:
            print("[FAIL] axpy mismatch", file=sys.stderr)
        return ok
except Exception:
    pass
'''

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


BLOCK = 1024  # knob: 256, 512, 1024


def run_kernel(x, y, out, alpha):
    n = x.numel()
    _axpy[(triton.cdiv(n, BLOCK),)](x, y, out, alpha, n, BLOCK=BLOCK)
'''


@pytest.fixture(scope="module")
def axpy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("axpy_task_package")
    (root / "xpuoj_problem" / "en").mkdir(parents=True)
    (root / "xpuoj_problem" / "meta.json").write_text(json.dumps({"id": 1, "samples": [{"inputData": "1\n"}]}))
    (root / "xpuoj_problem" / "testcase_config.py").write_text(CONFIG)
    docs = root / "xpuoj_problem" / "en"
    (docs / "_title.txt").write_text("AXPY")
    (docs / "00_statement.md").write_text('---\nsectionTitle: "Statement"\ntype: "Text"\n---\nout = x + alpha * y\n')
    (docs / "01_contract.triton.md").write_text(
        '---\nsectionTitle: "Contract"\ntype: "codeSample"\nlang: "triton"\n---\n`run_kernel(x, y, out, alpha)`\n')
    (root / "starter").mkdir()
    (root / "starter" / "axpy.md").write_text(f"# Smoke starter\n\n```python\n{KERNEL}```\n")
    return root


def test_loads_and_probes(axpy):
    task = load_task(axpy)
    assert task.manifest is None and task.starter(Language.TRITON).source.startswith("import triton")
    found = probe_task(task)
    assert len(found.cases) == 2 and found.outputs == [2]  # told by what the baseline returns


def test_evaluates_on_named_cases(axpy):
    task = load_task(axpy)
    cases = select_cases(task, "cpu", 2, "1-2")
    good = SandboxEvaluator(task, "cpu", cases, timeout_s=120).evaluate(KERNEL, Language.TRITON)
    assert good.status is Status.PASSED, good.reason
    assert all(c.rel_err is not None and c.rel_err < 1e-6 for c in good.cases)
    wrong = KERNEL.replace("x + alpha * y", "x + alpha * y * 1.001")
    bad = SandboxEvaluator(task, "cpu", cases, timeout_s=120).evaluate(wrong, Language.TRITON)
    assert bad.status is Status.INCORRECT and "check() failed" in bad.reason


def test_cpu_run_without_manifest_asks_for_cases(axpy):
    from optagent.task import TaskError

    with pytest.raises(TaskError, match="no smoke cases"):
        select_cases(load_task(axpy), "cpu", 2, None)
