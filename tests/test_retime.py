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
    # The recorded task_dir is relative to the checkout: a copy there, with the first smoke case alone
    # (the run's split kernel costs seconds per call under the interpreter; --no-hidden drops the rest).
    pkg = tmp_path / "tasks" / "flashattn_task_package"
    shutil.copytree(ROOT / "tasks" / "flashattn_task_package", pkg)
    head, smoke_1 = (pkg / "optagent.toml").read_text().split("[[smoke]]")[:2]
    (pkg / "optagent.toml").write_text(f"{head}[[smoke]]{smoke_1}")
    monkeypatch.chdir(tmp_path)
    code = main(["retime", "--runs-dir", str(runs), run.name, "--device", "cpu", "--no-hidden", "--json"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert code == 0 and doc["device"] == "cpu"
    assert "re-timing step 1 (2 of 2) on cpu" in out.err
    assert all(r["geomean_us"] for r in doc["ranked"])
    assert sorted(r["step"] for r in doc["ranked"]) == [0, 1]  # only the passing ones
    speedups = [r["geomean_speedup"] for r in doc["ranked"]]
    assert all(s for s in speedups) and speedups == sorted(speedups, reverse=True)
    assert {r["recorded_speedup"] for r in doc["ranked"]} != {None}  # the H200 figures, side by side


def test_retime_task_names_the_package_of_a_moved_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLE, runs)
    run = next(runs.iterdir())
    other = tmp_path / "elsewhere" / "mla_decode_task_package"  # a package, but not the run's
    shutil.copytree(ROOT / "tasks" / "mla_decode_task_package", other)
    code = main(["retime", "--runs-dir", str(runs), run.name, "--device", "cpu", "--task", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and f"{other}: not the task package run" in err and len(err.strip().splitlines()) == 1
    missing = main(["retime", "--runs-dir", str(runs), run.name, "--device", "cpu", "--task", str(tmp_path / "no")])
    assert missing == 2 and str(tmp_path / "no") in capsys.readouterr().err
