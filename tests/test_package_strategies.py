"""strategy.toml's one schema, and a task package that brings its own strategies/ folder.

A new task family then needs no change to optagent: the offline planner offers the package's
strategies (before the built-in ones), as candidates evaluated in the sandbox like any other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.schema import Language, RunState, Step, StepOutcome
from optagent.search.planners.offline import STRATEGY_ROOT, OfflinePlanner, load_strategies
from optagent.search.strategy_spec import StrategyError, read_spec
from optagent.task import TaskError, load_task

from tiny_package import FAST, STRATEGY_TOML, tiny_package, with_strategy


def optagent(*args: str, runs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(runs)}
    env.pop("OPTAGENT_BASE_URL", None)
    env.pop("OPTAGENT_MODEL", None)
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def spec_error(tmp_path: Path, toml: str, kernel: str = FAST) -> str:
    folder = with_strategy(tmp_path, toml, kernel) / "strategies"
    with pytest.raises(StrategyError) as e:
        read_spec(folder)
    text = str(e.value)
    assert text.startswith(f"{folder / 'strategy.toml'}: ") and "\n" not in text
    assert isinstance(e.value, TaskError)  # the CLI's one-line, exit-2 error
    return text[len(f"{folder / 'strategy.toml'}: "):]


def test_every_built_in_strategy_folder_reads_under_the_schema():
    folders = sorted(p.parent for p in STRATEGY_ROOT.glob("*/strategy.toml"))
    assert {f.name for f in folders} == {"paged_decode", "fused_moe", "mla_decode", "ragged_prefill"}
    for folder in folders:
        spec = read_spec(folder)
        assert spec.family == folder.name and spec.signature and spec.strategy


def edited(old: str, new: str) -> str:
    assert old in STRATEGY_TOML
    return STRATEGY_TOML.replace(old, new)


ENTRY = 'strategy[0] ("tiny_wide_blocks")'


@pytest.mark.parametrize("toml, said", [
    (edited('language = "triton"', 'language = "pascal"'),
     f"{ENTRY}.language: Input should be 'triton', 'cuda' or 'tilelang'"),
    (edited('idea = "one program per 4096 elements instead of one per 16"\n', ""), f"{ENTRY}.idea: Field required"),
    (edited('language = "triton"', 'langauge = "triton"'),
     f"{ENTRY}.langauge: unknown field (known: name, file, language, idea, gpu_checked)"),
    (edited("signature =", "signatures ="), "signatures: unknown field (known: family, signature, strategy)"),
    (edited('file = "wide.py"', 'file = "other.py"'), f"{ENTRY}.file: other.py not found beside strategy.toml"),
    (edited('file = "wide.py"', 'file = "../starter/naive.py"'),
     f"{ENTRY}.file: must name a file in the strategy folder (no absolute path, no '..')"),
    (edited('signature = ["x", "out", "n"]', 'signature = ["x", "y", "n"]'),
     f"{ENTRY}.file: wide.py's run_kernel(x, out, n) is not the signature listed in strategy.toml"),
    (edited('language = "triton"', 'language = "cuda"'), f"{ENTRY}.file: wide.py is triton source, listed as cuda"),
    (STRATEGY_TOML + STRATEGY_TOML[STRATEGY_TOML.index("[[strategy]]"):],
     "strategy names must be unique: tiny_wide_blocks listed twice"),
    (edited("[[strategy]]", "[strategy]"), "strategy: Input should be a valid list"),
    (STRATEGY_TOML[:STRATEGY_TOML.index("[[strategy]]")], "strategy: Field required"),
    (edited("[[strategy]]", "[[strategy"), "invalid TOML"),
], ids=["language", "missing-idea", "misspelt-field", "unknown-top-field", "no-file", "escaping-file", "signature",
        "language-of-file", "duplicate", "not-a-list", "no-strategies", "bad-toml"])
def test_a_bad_strategy_toml_is_one_line_naming_the_file_and_field(tmp_path, toml, said):
    assert spec_error(tmp_path, toml).startswith(said)


def test_a_kernel_without_run_kernel_is_named(tmp_path):
    assert spec_error(tmp_path, STRATEGY_TOML.replace('signature = ["x", "out", "n"]', ""),
                      FAST.replace("run_kernel", "launch")) == (
        'strategy[0] ("tiny_wide_blocks").file: wide.py defines no run_kernel')


def test_validate_reports_a_bad_package_strategy_toml(tmp_path):
    pkg = with_strategy(tiny_package(tmp_path / "pkg"), STRATEGY_TOML.replace('language = "triton"', 'lang = "x"'))
    proc = optagent("task", "validate", str(pkg), runs=tmp_path / "runs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"optagent: error: {pkg / 'strategies' / 'strategy.toml'}: "
                                  'strategy[0] ("tiny_wide_blocks").lang: unknown field')


def test_a_run_with_a_bad_package_strategy_toml_records_nothing(tmp_path):
    pkg = with_strategy(tiny_package(tmp_path / "pkg"), STRATEGY_TOML.replace('"triton"', '"fortran"'))
    runs = tmp_path / "runs"
    proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "1", runs=runs)
    assert proc.returncode == 2 and "strategies/strategy.toml: strategy[0]" in proc.stderr, proc.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_package_strategies_come_first_and_built_ins_follow(tmp_path):
    folder = with_strategy(tmp_path) / "strategies"
    names = [s.name for s in load_strategies(Language.TRITON, "fused_moe", [], package=folder)]
    assert names == ["tiny_wide_blocks"] + [s.name for s in load_strategies(Language.TRITON, "fused_moe", [])]
    assert len(names) > 1
    # other languages and kernels not yet checked on a GPU stay out, as for built-in ones
    assert load_strategies(Language.CUDA, None, [], package=folder) == []
    unchecked = STRATEGY_TOML + "gpu_checked = false\n"
    other = with_strategy(tmp_path / "other", unchecked) / "strategies"
    assert load_strategies(Language.TRITON, None, [], package=other) == []


def test_package_strategy_code_is_read_never_imported(tmp_path):
    marker = tmp_path / "imported"
    kernel = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n" + FAST
    pkg = with_strategy(tiny_package(tmp_path / "pkg"), kernel=kernel)
    task = load_task(pkg)
    planner = OfflinePlanner(Language.TRITON, None, ["x", "out", "n"], task.strategies_dir)
    assert [s.source for s in planner.strategies] == [kernel]
    assert not marker.exists()


def test_an_offline_cpu_run_proposes_the_package_strategy_and_keeps_the_starter_best(tmp_path):
    """On the CPU the faster strategy passes and becomes a node of the tree, but no timing replaces the best."""
    pkg = with_strategy(tiny_package(tmp_path / "pkg"))
    runs = tmp_path / "runs"
    proc = optagent("run", str(pkg), "--device", "cpu", "--max-steps", "2", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = [p for p in runs.iterdir() if (p / "config.json").exists()]
    steps = [Step.model_validate_json(p.read_text()) for p in sorted(run.glob("steps/*/step.json"))]
    assert steps[1].idea == "strategy tiny_wide_blocks: one program per 4096 elements instead of one per 16"
    assert steps[1].outcome is StepOutcome.PASSED, steps[1]
    assert steps[2].idea.startswith("strategy tiny_wide_blocks with BLOCK=")  # its knobs, second round
    state = RunState.model_validate_json((run / "state.json").read_text())
    assert state.best_step == 0 and (run / "best" / "kernel.py").read_text() == (run / "starter.py").read_text()
