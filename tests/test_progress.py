"""Live progress: the phases of a real evaluation as they happen, how they are shown, and
`optagent run --json` keeping stdout for the JSON document alone."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation.serial_pool import SerialPool
from optagent.cli.live import LiveProgress
from optagent.search.loop import Limits, Loop
from optagent.progress import Phase, Progress, Subject
from optagent.schema import Language, RunConfig, Status
from optagent.runs.store import RunStore, new_run_id
from optagent.task import load_task

from test_loop import ScriptedEvaluator, ScriptedPlanner  # noqa: E402  (tests/ is on sys.path under pytest)

STARTER_LINE = "    out = acc / tl.where(l_i > 0, l_i, 1.0)"


def test_a_real_cpu_evaluation_reports_its_phases_in_order(task_dir):
    task = load_task(task_dir)
    cases = [c for c in select_cases(task, "cpu", 0, None) if c.label in ("smoke-1", "hidden-1")]
    events: list[tuple[float, Progress]] = []
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=300).evaluate(
        task.starter(Language.TRITON).source, Language.TRITON,
        progress=lambda e: events.append((time.monotonic(), e)))
    assert result.status is Status.PASSED, result.reason
    seen = [(e.phase, e.case, e.index, e.total) for _, e in events]
    assert seen == [
        (Phase.STARTING, None, None, None),
        (Phase.BASELINE, "smoke-1", 1, 1),  # hidden cases are never timed, so neither is their baseline
        (Phase.COMPILING, None, None, None),
        (Phase.CASE, "smoke-1", 1, 2),
        (Phase.CASE, "hidden-1", 2, 2),
        (Phase.TIMING, "smoke-1", 1, 2),  # every case checked first, then the timed ones in one lane hold
        (Phase.JUDGING, None, None, 2),
        (Phase.JUDGING, "smoke-1", 1, 2),
        (Phase.JUDGING, "hidden-1", 2, 2),
    ]
    # real time: the case events came while the worker ran, seconds apart, not all at its end
    at = {(e.phase, e.case): t for t, e in events}
    assert at[(Phase.JUDGING, None)] - at[(Phase.CASE, "smoke-1")] > 0.3  # its checks and timing between
    # the evaluator knows no step and no subject: the loop stamps those
    assert all(e.step is None and e.subject is Subject.CANDIDATE for _, e in events)


class PhasedEvaluator(ScriptedEvaluator):
    """Scripted timings, telling its sink that it started, as the sandbox does."""

    def evaluate(self, source, language, progress=None):
        if progress:
            progress(Progress(phase=Phase.STARTING))
        return super().evaluate(source, language)


def test_the_loop_stamps_steps_and_says_when_it_retimes(tmp_path, task_dir):
    task = load_task(task_dir)
    cfg = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name, task_digest="x",
                    language=Language.TRITON, device="cpu", planner="offline", timeout_s=10, min_gain=0.01,
                    patience=5, max_steps=50)
    store = RunStore.create(tmp_path / "runs", cfg, "starter")
    events: list[Progress] = []
    ev = PhasedEvaluator({"starter": [100.0], "fast": [85.0]})  # a 17% gain: re-timed back to back
    Loop(store, task, ScriptedPlanner(["fast"]), SerialPool(ev), Limits(), progress=events.append).run()
    assert [(e.step, e.phase, e.subject) for e in events] == [
        (0, Phase.STARTING, Subject.CANDIDATE),
        (1, Phase.PROPOSING, Subject.CANDIDATE),
        (1, Phase.STARTING, Subject.CANDIDATE),
        (0, Phase.STARTING, Subject.INCUMBENT_RETIME),  # the round's re-time: each event names its kernel
        (1, Phase.STARTING, Subject.CANDIDATE_RETIME),
        (2, Phase.PROPOSING, Subject.CANDIDATE),  # the planner is asked again, and has nothing more
    ]


def _plain(heartbeat_s: float = 60.0) -> tuple[LiveProgress, io.StringIO]:
    out = io.StringIO()
    return LiveProgress(Console(file=out, width=200, force_terminal=False), heartbeat_s=heartbeat_s), out


def test_plain_lines_on_each_new_stage_not_on_each_case():
    live, out = _plain()
    assert not live.live
    live(Progress(phase=Phase.STARTING, step=3))
    live(Progress(phase=Phase.COMPILING, step=3))
    for k, label in enumerate(("smoke-1", "smoke-2", "smoke-3"), 1):
        live(Progress(phase=Phase.CASE, step=3, case=label, index=k, total=3))
        live(Progress(phase=Phase.TIMING, step=3, case=label, index=k, total=3))
    live(Progress(phase=Phase.JUDGING, step=3, total=3))
    live(Progress(phase=Phase.STARTING, step=3, subject=Subject.INCUMBENT_RETIME))
    live.pause()
    live(Progress(phase=Phase.PROPOSING, step=4))
    live.close()
    lines = out.getvalue().splitlines()
    assert [ln.split(" (step")[0] for ln in lines] == [
        "  ... step 3: starting the worker",
        "  ... step 3: compiling",
        "  ... step 3: running case 1/3 (smoke-1)",
        "  ... step 3: judging 3 cases",
        "  ... step 3: re-timing the incumbent: starting the worker",
        "  ... step 4: the planner is proposing a kernel",
    ]


def test_a_long_phase_gets_heartbeat_lines():
    out, now = io.StringIO(), [100.0]
    live = LiveProgress(Console(file=out, width=200, force_terminal=False), heartbeat_s=0.4, clock=lambda: now[0])
    live(Progress(phase=Phase.COMPILING, step=1))
    time.sleep(0.3)  # the ticker looks every 0.1 s; by its clock no heartbeat is due yet
    now[0] += 30
    time.sleep(0.3)
    now[0] += 30
    time.sleep(0.3)
    live.pause()
    said = out.getvalue()
    now[0] += 30
    time.sleep(0.3)
    live.close()
    assert said.splitlines() == ["  ... step 1: compiling", "  ... step 1: compiling (30 s)",
                                 "  ... step 1: compiling (60 s)"]
    assert out.getvalue() == said  # paused and closed: silent


def test_on_a_terminal_a_live_status_line_shows_the_phase_and_is_erased():
    out = io.StringIO()
    live = LiveProgress(Console(file=out, width=120, force_terminal=True))
    assert live.live
    live(Progress(phase=Phase.TIMING, step=2, case="smoke-2", index=2, total=3))
    time.sleep(0.6)
    live.close()
    raw = out.getvalue()
    assert "step 2: timing case 2/3 (smoke-2)" in raw
    assert "\x1b[2K" in raw  # transient: the line is cleared when the step's own line comes


def test_run_json_stdout_is_one_document_and_progress_and_reasons_go_to_stderr(tmp_path, task_dir):
    replay = tmp_path / "replay.jsonl"
    wrong = STARTER_LINE.replace("out = acc", "out = 1.05 * acc")
    reply = f"IDEA: scale the output\n\n<<<<<<< SEARCH\n{STARTER_LINE}\n=======\n{wrong}\n>>>>>>> REPLACE\n"
    replay.write_text(json.dumps({"reply": reply}) + "\n")
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("OPTAGENT_BASE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "optagent.cli.main", "run", str(task_dir), "--planner", "replay",
                           "--replay", str(replay), "--no-hidden", "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    run = Path(doc["path"])
    assert doc["run_id"] == run.name and (run / "config.json").is_file()
    assert doc["state"]["status"] == "EXHAUSTED" and doc["state"]["steps"] == 2
    assert doc["best"]["status"] == "PASSED"
    err = proc.stderr.splitlines()
    # (a run's baselines are timed once per lane by the pool's baseline job, not in step 0's worker)
    for phase in ("step 0: starting the worker", "step 0: compiling", "step 0: running case 1/3 (smoke-1)", "step 0: judging 3 cases",
                  "step 1: the planner is proposing a kernel", "step 1: running case 1/3 (smoke-1)"):
        assert any(ln.startswith(f"  ... {phase}") for ln in err), phase
    # the failed step's line is followed by the first line of its reason, indented
    k = next(i for i, ln in enumerate(err) if ln.startswith("step   1") and "FAILED" in ln)
    assert err[k + 1].startswith("          case smoke-1: relative error") and "exceeds" in err[k + 1]
    assert "step   0" in proc.stderr and "EXHAUSTED" in proc.stderr


def test_json_is_the_only_thing_on_stdout(task_dir, capsys):
    from optagent.cli.main import main

    fixtures = Path(__file__).resolve().parent / "fixtures" / "run_sample"
    for args in (["runs"], ["show", "3f9a2c"], ["show", "3f9a2c", "--step", "1"], ["leaderboard"]):
        assert main([*args, "--runs-dir", str(fixtures), "--json"]) == 0
        said = capsys.readouterr()
        json.loads(said.out)
        assert "┃" not in said.out  # no table on stdout
    proc = subprocess.run([sys.executable, "-m", "optagent.cli.main", "task", "validate", str(task_dir), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["task"] == "flashattn_decode" and doc["cases"] >= 1 and "triton" in doc["languages"]
    assert proc.stderr.startswith("ok ")
