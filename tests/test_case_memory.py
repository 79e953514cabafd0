"""A case whose generation is slow (a generator drawing on the host) is kept in host memory for the timing phase,
which goes over every case again after the checks (worker/harness.py): the same values, fresh tensors each time,
and nothing kept over the budget."""

from __future__ import annotations

from pathlib import Path

import torch

from optagent.messages import CaseSpec
from optagent.schema import CaseKind
from optagent.worker import harness

SILU = Path(__file__).parent / "fixtures" / "packages" / "silu_mul_fp8"


def counted(rt: harness.TaskRuntime) -> tuple[harness.TaskRuntime, list]:
    """rt, with each genTestCase call's sizes recorded in the list."""
    calls: list = []
    real = rt.config.genTestCase

    def draw(*a, **k):
        calls.append(a[0])
        return real(*a, **k)
    rt.config.genTestCase = draw
    return rt, calls


def _runtime(monkeypatch, slow_s: float, keep_bytes: int) -> tuple[harness.TaskRuntime, list]:
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", slow_s)
    monkeypatch.setattr(harness, "HOST_KEEP", keep_bytes)
    return counted(harness.TaskRuntime(str(SILU), "cpu"))


def _case(i: int) -> CaseSpec:
    return CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i)


def test_a_slowly_generated_case_comes_back_from_host_memory_as_fresh_equal_tensors(monkeypatch):
    rt, calls = _runtime(monkeypatch, 0.0, 1 << 30)  # every generation counts as slow here
    first, _ = rt.make_args(_case(1), None)
    kept = [a.clone() for a in first if isinstance(a, torch.Tensor)]
    for a in first:
        if isinstance(a, torch.Tensor):
            a.zero_()  # the handed-out copy is the caller's to write
    rt.make_args(_case(2), None)
    again, _ = rt.make_args(_case(1), None)
    assert len(calls) == 2  # case 1 was not drawn again
    assert all(torch.equal(a, b) for a, b in zip(kept, [a for a in again if isinstance(a, torch.Tensor)]))


def test_fast_or_too_large_cases_are_drawn_again(monkeypatch):
    rt, calls = _runtime(monkeypatch, 60.0, 1 << 30)  # no generation is that slow
    for i in (1, 2, 1):
        rt.make_args(_case(i), None)
    assert len(calls) == 3
    rt, calls = _runtime(monkeypatch, 0.0, 16)  # no room for any case
    for i in (1, 2, 1):
        rt.make_args(_case(i), None)
    assert len(calls) == 3
