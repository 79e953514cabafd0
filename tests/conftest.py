"""Shared fixtures; GPU tests are skipped where no CUDA device is visible."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# pytest-xdist's workers set COLUMNS=80, and the views size piped tables from COLUMNS as a terminal's
# width: without this the tables of a run under -n would wrap where a plain pytest run's do not.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tasks" / "flashattn_task_package"
# The seed package beside the checkout, or a copy carried inside it (.seed/, git-ignored) on the GPU machine.
SEED_PLACES = (ROOT.parent / "shared" / "seed" / "flashattn_task_package", ROOT / ".seed" / "flashattn_task_package")
SEED = next((p for p in SEED_PLACES if p.is_dir()), SEED_PLACES[0])


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Modules whose module-scoped fixtures do real work once for their tests (a run, a batch of
# subprocesses, nvcc builds): under xdist each runs on one worker, whole, and these go out first
# (most tests first); else every worker that got one of their tests would do that work again.
# The other tests go out one by one, in the order below.
SHARED_SETUP = {"test_strategies_decode", "test_more_tasks", "test_strategies_mla_decode",
                "test_strategies_ragged_prefill", "test_memory_runs", "test_pool", "test_cli_runs",
                "test_task_package", "test_packaging"}
# The modules with the longest single tests (seconds on 2 cores: /work/briefs/ci_durations.txt) start
# first, so that neither worker begins a long test while the other runs out of work; the others follow
# in their usual order.
LONGEST_FIRST = ["test_outside", "test_unseen", "test_run_outcomes", "test_progress", "test_rounds",
                 "test_package_strategies", "test_strategies_fused_moe", "test_native_timer", "test_isolation",
                 "test_retime", "test_integrity", "test_evaluator", "test_other_formats", "test_step_commit",
                 "test_task_loader", "test_cpu_interpreter", "test_fresh_load"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """-n (with --dist load or none): xdist's load scheduling, each SHARED_SETUP module one unit of work.
    (xdist's --dist loadgroup cannot group them: it renames node ids in a way pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).stem in SHARED_SETUP else nodeid

    return SharedSetupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's tests keep their order
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def task_dir() -> Path:
    return TASK


@pytest.fixture(scope="session")
def seed_dir() -> Path:
    if not SEED.is_dir():
        pytest.skip("the seed package (../shared/seed) is not beside this checkout")
    return SEED


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Scratch dirs and run dirs of tests stay out of the user's home.
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("OPTAGENT_SCRATCH", str(base / "scratch"))
