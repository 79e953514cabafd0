"""Slow cases kept in the cache (worker/case_store.py): a trusted process that drew a case slowly keeps it, a later
process of the same package reads it back instead of drawing it (the same bits, even from a generator that never
draws the same twice), one that may not write keeps nothing, and only what comes back as it was is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from optagent.messages import CaseSpec
from optagent.schema import CaseKind
from optagent.settings import CACHE_ENV
from optagent.worker import case_store, harness
from optagent.worker.case_store import CaseStore, keepable
from tests.test_case_memory import counted

ADD_RMSNORM = Path(__file__).parent / "fixtures" / "packages" / "add_rmsnorm"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # settings() reads the environment each time
    return tmp_path / "cache"


@pytest.fixture
def package(tmp_path) -> Path:
    """add_rmsnorm, its generator unseeded: two draws of a case never agree."""
    pkg = tmp_path / "pkg"
    shutil.copytree(ADD_RMSNORM, pkg)
    config = pkg / "xpuoj_problem" / "testcase_config.py"
    config.write_text(config.read_text().replace("g = torch.Generator().manual_seed(1000 * rows + cols)",
                                                 "g = torch.Generator(); g.seed()"))
    return pkg


def runtime(package: Path, write: bool) -> tuple[harness.TaskRuntime, list]:
    rt = harness.TaskRuntime(str(package), "cpu")
    rt.store = CaseStore(rt.task, rt.device, write=write)
    return counted(rt)


def case(i: int, max_elements=None) -> CaseSpec:
    return CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i, max_elements=max_elements)


def tensors(args: list) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (the outputs are torch.empty: whatever the memory held, NaNs too)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def test_a_slow_case_kept_by_a_trusted_process_is_read_back_by_the_next(cache, package, monkeypatch):
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 0.0)  # every generation counts as slow
    judge, drawn = runtime(package, write=True)
    first, sizes = judge.make_args(case(2), None)
    assert len(drawn) == 1 and len(list(cache.glob("cases/*.case"))) == 1
    candidate, drawn_again = runtime(package, write=False)
    again, sizes_again = candidate.make_args(case(2), None)
    assert drawn_again == []  # read, not drawn
    assert sizes_again == sizes and [a for a in again if not isinstance(a, torch.Tensor)] == \
        [a for a in first if not isinstance(a, torch.Tensor)]
    assert all(same(a, b) for a, b in zip(tensors(first), tensors(again)))
    fresh = judge.config.genTestCase(judge.case_sizes(2)[0], "cpu")
    assert not same(tensors(fresh)[0], tensors(first)[0])  # the generator itself never repeats


def test_a_process_that_may_not_write_keeps_nothing_and_a_fast_case_is_not_kept(cache, package, monkeypatch):
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 0.0)
    runtime(package, write=False)[0].make_args(case(1), None)
    assert not list(cache.glob("cases/*"))
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 60.0)
    runtime(package, write=True)[0].make_args(case(1), None)
    assert not list(cache.glob("cases/*"))


def test_shrunk_sizes_and_other_packages_are_kept_apart(cache, package, monkeypatch):
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 0.0)
    rt, _ = runtime(package, write=True)
    small, small_sizes = rt.make_args(case(3, max_elements=4096), None)
    full, full_sizes = rt.make_args(case(3), None)
    assert tensors(small)[0].numel() < tensors(full)[0].numel() and small_sizes != full_sizes
    reader, drawn = runtime(package, write=False)
    back, back_sizes = reader.make_args(case(3, max_elements=4096), None)
    assert drawn == [] and back_sizes == small_sizes and same(tensors(back)[0], tensors(small)[0])
    (package / "NOTES.md").write_text("changed")  # another package now: its own keys
    other, drawn = runtime(package, write=False)
    other.make_args(case(3), None)
    assert len(drawn) == 1


def test_a_damaged_file_is_drawn_again(cache, package, monkeypatch):
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 0.0)
    runtime(package, write=True)[0].make_args(case(1), None)
    (kept,) = cache.glob("cases/*.case")
    kept.write_bytes(kept.read_bytes()[:40])
    rt, drawn = runtime(package, write=False)
    args, _ = rt.make_args(case(1), None)
    assert len(drawn) == 1 and tensors(args)[0].shape == (1, 4096)


def test_only_arguments_that_come_back_as_they_were_are_kept():
    x = torch.randn(4, 6)
    assert keepable([x, torch.zeros(3, dtype=torch.int32), 5, 2.5, None, "mode", True])
    assert not keepable([x.t()])  # strides a kernel may rely on
    assert not keepable([x, x[1:]])  # two arguments on one storage
    assert not keepable([x, [1, 2]])  # a list: JSON gives back another type
    assert not keepable([x.requires_grad_()])


def test_the_store_is_trimmed_to_its_size(cache, package, monkeypatch):
    monkeypatch.setattr(harness, "SLOW_GENERATION_S", 0.0)
    monkeypatch.setattr(case_store, "MAX_BYTES", 60_000)  # one 1 x 4096 case (40 kB) fits, two do not
    rt, _ = runtime(package, write=True)
    rt.make_args(case(1), None)
    rt.make_args(case(1, max_elements=2048), None)
    assert len(list(cache.glob("cases/*.case"))) == 1


def test_in_a_pool_the_baseline_job_keeps_the_slow_cases_the_candidate_and_its_judge_then_share(
        cache, package, monkeypatch):
    """End to end under the sandbox: the lane's baseline job (trusted) draws each slow case once and keeps it; the
    candidate's process and its judge read it back, so even a generator that never draws the same twice gives
    them one set of inputs and the kernel passes. Without the store (a writable cache: unshare, none) the same
    evaluation is judged on inputs the candidate never saw, and refused."""
    from optagent.evaluation import isolation
    from optagent.evaluation.evaluator import SandboxEvaluator, choose_cases
    from optagent.messages import Baseline
    from optagent.schema import Device, Language, Status
    from optagent.task import load_task

    if not isolation.describe(isolation.mechanism()).ro_fs:
        pytest.skip("the case store needs an isolation that leaves the cache to trusted workers (bwrap, Landlock)")
    config = package / "xpuoj_problem" / "testcase_config.py"
    config.write_text(config.read_text().replace("        (rows, cols) = sizes[0]\n",
                                                 "        (rows, cols) = sizes[0]\n        __import__('time').sleep(0.08)\n"))
    task = load_task(package)
    cases = choose_cases(task, Device.CPU, None)[:1]
    ev = SandboxEvaluator(task, Device.CPU, cases, timeout_s=240)
    baselines = ev.time_baselines().all(Baseline)
    assert baselines and len(list(cache.glob("cases/*.case"))) == 1
    source = task.starter(Language.TRITON).source
    result = ev.evaluate_on(source, Language.TRITON, baselines=lambda: baselines)
    assert result.status is Status.PASSED, result.reason
    real = SandboxEvaluator._job
    monkeypatch.setattr(SandboxEvaluator, "_job", lambda self, *a, **k: real(self, *a, **k).model_copy(
        update={"stored_cases": False}))
    unkept = ev.evaluate_on(source, Language.TRITON, baselines=lambda: baselines)
    # the judge's own draw differs from the candidate's: its inputs' checksums do not match the judge's rebuild
    assert unkept.status is Status.REJECTED and "modified its input" in (unkept.reason or ""), unkept.reason
