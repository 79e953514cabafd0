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


def pytest_collection_modifyitems(config, items):
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
