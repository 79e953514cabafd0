"""The leaderboard never ranks CPU-interpreter runs with GPU runs, nor exports one over a GPU kernel.

Runs: the recorded H200 run of fixtures/run_sample (1.92x), and CPU runs of the same task made here
whose interpreter "speedups" are far higher (5x), one of them an untouched starter.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from optagent.cli.main import main
from optagent.report.leaderboard import CPU_TITLE, gather
from optagent.report.board_page import render_leaderboard
from optagent.schema import (CaseKind, CaseResult, EvalResult, Language, RunConfig, RunState, RunStatus, Status,
                             Timing)
from optagent.runs.store import RunStore

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run_sample"
GPU_RUN = "20260721-093012-flashattn_decode-3f9a2c"
STARTER = "import triton\n\n\n@triton.jit\ndef k(x):\n    pass  # starter\n"


def cpu_run(root: Path, run_id: str, task: str, source: str, speedup: float, day: int) -> RunStore:
    cfg = RunConfig(run_id=run_id, task_dir="/nowhere", task_name=task, task_digest="x", language=Language.TRITON,
                    device="cpu", planner="offline", timeout_s=60, min_gain=0.01, patience=3, max_steps=1,
                    created_at=datetime(2026, 8, day, tzinfo=timezone.utc))
    store = RunStore.create(root, cfg, STARTER)
    t = 1000.0 / speedup
    case = CaseResult(case="smoke-1", kind=CaseKind.SMOKE, status=Status.PASSED, time_us=t, baseline_us=1000.0,
                      time=Timing(median_us=t, p10_us=t, p90_us=t, samples=2), timing_kind="cpu-interpreter")
    store.save_best(source, EvalResult(status=Status.PASSED, language=Language.TRITON, device="cpu",
                                       device_name="cpu", source_sha256="0" * 64, cases=[case], wall_s=1.0))
    store.save_state(RunState(status=RunStatus.MAX_STEPS, steps=1))
    return store


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(FIXTURES, root)
    changed = STARTER.replace("starter", "changed on the CPU")
    cpu_run(root, "20260801-000000-flashattn_decode-cpu001", "flashattn_decode", changed, 5.0, 1)
    cpu_run(root, "20260802-000000-flashattn_decode-cpu002", "flashattn_decode", STARTER, 4.0, 2)
    cpu_run(root, "20260803-000000-toy-cpu003", "toy", changed, 0.39, 3)
    cpu_run(root, "20260804-000000-toy-cpu004", "toy", STARTER, 0.5, 4)  # newer, faster, but the starter
    return root


def lb(runs: Path, capsys, *args: str) -> str:
    assert main(["leaderboard", "--runs-dir", str(runs), *args]) == 0
    return capsys.readouterr()


def test_the_table_ranks_gpu_runs_and_lists_cpu_runs_apart(runs, capsys):
    out = lb(runs, capsys).out
    gpu_part, _, cpu_part = out.partition(CPU_TITLE)
    assert cpu_part, out
    assert GPU_RUN in gpu_part and "cpu00" not in gpu_part
    assert re.search(r"\b1\b.*flashattn_decode.*1\.92x", gpu_part)
    for n in range(1, 5):
        assert f"cpu00{n}" in cpu_part
    assert "5.00x" not in out and "4.00x" not in out  # no interpreter "speedup" is shown as a figure
    assert GPU_RUN not in cpu_part
    assert "starter" in cpu_part and "not GPU timings" in cpu_part


def test_json_gives_cpu_runs_no_rank(runs, capsys):
    rows = {r["run_id"]: r for r in json.loads(lb(runs, capsys, "--json").out)}
    assert rows[GPU_RUN]["rank"] == 1 and rows[GPU_RUN]["ranked_by_speed"] is True
    cpu = [r for r in rows.values() if r["device"] == "cpu"]
    assert len(cpu) == 4 and all(r["rank"] is None and r["ranked_by_speed"] is False for r in cpu)
    assert rows["20260804-000000-toy-cpu004"]["best_is_starter"] is True
    assert rows["20260803-000000-toy-cpu003"]["best_is_starter"] is False


def test_export_never_puts_a_cpu_kernel_over_a_gpu_one(runs, tmp_path, capsys):
    out = tmp_path / "export"
    said = lb(runs, capsys, "--export", str(out), "--json")
    json.loads(said.out)  # --json: the document alone on stdout, the export lines on stderr
    assert "exported" in said.err and "exported" not in said.out
    gpu = RunStore.open(runs, GPU_RUN)
    assert (out / "flashattn_decode" / "cuda" / "submit.py").read_text() == gpu.best()[0]
    assert not (out / "flashattn_decode" / "cpu").exists()
    # a task with CPU runs only: a changed kernel before the (newer, "faster") starter, marked as untimed
    toy = out / "toy" / "cpu"
    assert (toy / "submit.py").read_text() == STARTER.replace("starter", "changed on the CPU")
    meta = json.loads((toy / "result.json").read_text())
    assert meta["run_id"] == "20260803-000000-toy-cpu003" and "not GPU timings" in meta["note"]


def test_html_has_unranked_cpu_sections_after_the_gpu_ones(runs):
    page = render_leaderboard(gather(runs))
    sections = re.findall(r'<section class="board-group( cpu)?">(.*?)</section>', page, flags=re.S)
    assert [bool(cpu) for cpu, _ in sections] == [False, True, True]
    gpu_html, cpu_html = sections[0][1], "".join(body for _, body in sections[1:])
    assert GPU_RUN in gpu_html and "cpu00" not in gpu_html
    assert "CPU interpreter (correctness only, not ranked by speed)" in cpu_html
    assert '<svg class="chart' not in cpu_html and "#1 " not in cpu_html and "5.00x" not in cpu_html
    assert page.count('<svg class="chart board"') == 1
