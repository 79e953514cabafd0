"""``optagent retime``: a run's passing candidates evaluated again here, and ranked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from optagent.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "run_sample"


def test_retime_ranks_the_passing_candidates_of_a_run_made_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLE, runs)
    run = next(runs.iterdir())
    for step in sorted((run / "steps").iterdir()):
        if int(step.name) > 3:  # an H200 run: keep the starter, one accepted and two failed candidates
            shutil.rmtree(step)
    monkeypatch.chdir(ROOT)  # the recorded task_dir is relative to the checkout
    code = main(["retime", "--runs-dir", str(runs), run.name, "--device", "cpu", "--no-hidden", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["device"] == "cpu"
    assert sorted(r["step"] for r in doc["ranked"]) == [0, 1]  # only the passing ones
    speedups = [r["geomean_speedup"] for r in doc["ranked"]]
    assert all(s for s in speedups) and speedups == sorted(speedups, reverse=True)
    assert {r["recorded_speedup"] for r in doc["ranked"]} != {None}  # the H200 figures, side by side
