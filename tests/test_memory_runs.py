"""Memory across runs, end to end on CPU: a second run on a task reads the first run's ledger.

The tiny package (tests/tiny_package.py) with its own strategy: the first offline run measures the
strategy and one of its knob settings; a second run skips what it measured; with --fresh it does
not; the LLM planner is told what the first run found. On the CPU no timing replaces the best, so the
best known kernel of a CPU bench is the starter: starting from an earlier run's best kernel is tested
on a GPU bench in tests/test_ledger.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from tiny_package import tiny_package, with_strategy

from optagent.schema import RunState, Step, StepOutcome
from optagent.runs.ledger import Ledger

LLM_ENV = ("OPTAGENT_BASE_URL", "OPTAGENT_MODEL", "OPTAGENT_API_KEY", "OPENAI_API_KEY")
STRATEGY_IDEA = "strategy tiny_wide_blocks: one program per 4096 elements instead of one per 16"


def optagent(*args: str, runs: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LLM_ENV}
    env["OPTAGENT_RUNS_DIR"] = str(runs)
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def runs_in(runs: Path) -> list[Path]:
    return sorted(p for p in runs.iterdir() if (p / "config.json").exists())


def steps_of(run: Path) -> list[Step]:
    return [Step.model_validate_json(p.read_text()) for p in sorted(run.glob("steps/*/step.json"))]


def ledger_file(runs: Path) -> Path:
    (path,) = (runs / "ledger").glob("*.jsonl")
    return path


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One offline run: the starter, the package's strategy (PASSED), the strategy at BLOCK=1024 (PASSED)."""
    base = tmp_path_factory.mktemp("memory")
    pkg = with_strategy(tiny_package(base / "pkg"))
    runs = base / "runs"
    proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "2", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = runs_in(runs)
    return pkg, runs, run


def copy_runs(first, tmp_path: Path) -> Path:
    _, runs, _ = first
    shutil.copytree(runs, tmp_path / "runs")  # the ledger names kernels relative to its runs directory
    return tmp_path / "runs"


def test_the_first_run_is_in_the_ledger(first):
    _, runs, run = first
    entries = Ledger(ledger_file(runs)).entries()
    assert [(e.run_id, e.step, e.outcome) for e in entries] == [
        (run.name, 0, StepOutcome.BASELINE), (run.name, 1, StepOutcome.PASSED), (run.name, 2, StepOutcome.PASSED)]
    steps = steps_of(run)
    for entry, step in zip(entries, steps):
        assert entry.idea == step.idea and entry.kernel_sha256 == step.candidate_sha256
        assert entry.geomean_time_us == pytest.approx(step.result.geomean_time_us)
        assert (runs / entry.source).is_file() and entry.device_name == "cpu"
    assert entries[1].setting == {"strategy": "tiny_wide_blocks"}
    assert entries[2].setting == {"strategy": "tiny_wide_blocks", "knobs": {"BLOCK": 1024}}
    # measured against the kernel each was made from: on the CPU the newest passing one (the best stays the starter)
    assert [e.parent for e in entries] == [None, 0, 1]
    assert entries[1].gain == pytest.approx(entries[0].geomean_time_us / entries[1].geomean_time_us - 1)
    assert entries[2].gain == pytest.approx(entries[1].geomean_time_us / entries[2].geomean_time_us - 1)


def test_a_second_run_skips_what_was_measured(first, tmp_path):
    pkg, _, run1 = first
    runs = copy_runs(first, tmp_path)
    proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "2", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 step(s) of 1 earlier run(s)" in proc.stdout
    run2 = next(r for r in runs_in(runs) if r.name != run1.name)
    steps, earlier = steps_of(run2), steps_of(run1)
    assert steps[0].idea == "the starter kernel"  # still evaluated: the baseline for speedups
    # the first run's two kernels are not measured again: the search goes on past them
    measured = {s.candidate_sha256 for s in earlier}
    assert not measured & {s.candidate_sha256 for s in steps[1:]}
    assert steps[1].idea.endswith("(2 setting(s) before it skipped: measured by earlier runs)"), steps[1].idea
    entries = Ledger(ledger_file(runs)).entries()
    assert len(entries) == 6 and {e.run_id for e in entries} == {run1.name, run2.name}
    listed = optagent("ledger", str(pkg), "--json", runs=runs)  # by package: this version's ledger
    assert listed.returncode == 0 and [(e["run_id"], e["step"]) for e in json.loads(listed.stdout)] == [
        (e.run_id, e.step) for e in entries]
    table = optagent("ledger", "tiny_affine", runs=runs)  # by name
    assert table.returncode == 0 and run2.name in table.stdout and "measured by earlier runs" in table.stdout
    missing = optagent("ledger", "no_such_task", runs=runs)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"optagent: error: {runs / 'ledger'}: no ledger for task no_such_task")


def test_fresh_recalls_nothing(first, tmp_path):
    pkg, _, run1 = first
    runs = copy_runs(first, tmp_path)
    proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "1", "--fresh", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--fresh: none of it is used" in proc.stdout
    run = next(r for r in runs_in(runs) if r.name != run1.name)
    assert [s.idea for s in steps_of(run)] == ["the starter kernel", STRATEGY_IDEA]  # as the first run began
    assert json.loads((run / "config.json").read_text())["fresh"] is True
    assert len(Ledger(ledger_file(runs)).entries()) == 5  # still recorded


def test_the_llm_planner_is_told_what_the_first_run_found(first, tmp_path):
    pkg, _, run1 = first
    runs = copy_runs(first, tmp_path)
    fake = FakeOpenAI()
    try:
        fake.reply("IDEA: nothing this time\n(no code)")
        proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "1", "--planner", "llm",
                        "--base-url", fake.base_url, "--model", "fake-model", runs=runs)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        prompt = fake.user_prompt(0)
    finally:
        fake.close()
    block = prompt[prompt.index("## What earlier runs on this task found"):]
    block = block[:block.index("\n## ", 1)]
    assert "3 attempts from 1 earlier run(s)" in block
    assert f"| {run1.name} | 1 | cpu, triton | {STRATEGY_IDEA} | PASSED |" in block
    assert f"| {run1.name} | 2 | cpu, triton | strategy tiny_wide_blocks with BLOCK=1024 | PASSED |" in block
