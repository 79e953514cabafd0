"""The product end to end on CPU: optagent run / resume / runs / show / leaderboard, in real subprocesses."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optagent.schema import RunState, Step

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "fixtures" / "replay_decode.jsonl"


def optagent(*args: str, runs: Path, timeout: float = 600, env_extra: dict | None = None):
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(runs), **(env_extra or {})}
    env.pop("OPTAGENT_BASE_URL", None)
    env.pop("OPTAGENT_MODEL", None)
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if (p / "config.json").exists()]
    assert len(dirs) == 1
    return dirs[0]


def all_json_valid(run: Path) -> None:
    for p in run.rglob("*.json"):
        json.loads(p.read_text())  # never half-written
    assert not list(run.rglob(".*.tmp"))


def ideas(run: Path) -> list[str]:
    return [Step.model_validate_json(p.read_text()).idea for p in sorted(run.glob("steps/*/step.json"))]


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory, task_dir):
    runs = tmp_path_factory.mktemp("runs")
    proc = optagent("run", str(task_dir), "--planner", "replay", "--replay", str(REPLAY), "--no-hidden", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return runs, proc


def test_replay_run_end_to_end(replay_run):
    runs, proc = replay_run
    run = only_run(runs)
    all_json_valid(run)
    state = RunState.model_validate_json((run / "state.json").read_text())
    assert state.status.value == "EXHAUSTED" and state.steps == 4
    assert (run / "best" / "diff.patch").exists() and (run / "starter.py").exists()
    assert (run / "steps" / "0001" / "proposal.json").exists() and (run / "steps" / "0001" / "candidate.py").exists()
    proposal = json.loads((run / "steps" / "0002" / "proposal.json").read_text())
    assert "SEARCH text was not found" in proposal["error"]  # the non-applying edit is a recorded step
    assert "step   2" in proc.stdout and "NO_KERNEL" in proc.stdout
    # a CPU run's step lines say what was established, not an interpreter time that ranks nothing (a GPU
    # run's show the geomean time its verdict was taken on); its last line says which kernels passed
    baseline_step = Step.model_validate_json((run / "steps" / "0000" / "step.json").read_text())
    line = next(x for x in proc.stdout.splitlines() if x.startswith("step   0"))
    assert "(correct on the cases run)" in line and f"{baseline_step.result.geomean_time_us:.1f} us" not in line
    assert "kernels that passed: step 0" in proc.stdout and f"optagent retime {run.name}` on a GPU" in proc.stdout


def test_runs_show_and_leaderboard(replay_run, task_dir):
    runs, _ = replay_run
    run = only_run(runs)
    listing = optagent("runs", runs=runs)
    assert run.name in listing.stdout and "replay" in listing.stdout
    shown = optagent("show", run.name[-6:], runs=runs)  # a unique part of the id is enough
    assert shown.returncode == 0 and "BASELINE" in shown.stdout
    step = optagent("show", run.name, "--step", "1", runs=runs)
    assert step.returncode == 0 and "smoke-1" in step.stdout
    board = optagent("leaderboard", "--diff", runs=runs)
    assert board.returncode == 0 and "flashattn_decode" in board.stdout
    best = (run / "best" / "kernel.py").read_text()
    starter = (run / "starter.py").read_text()
    if best != starter:
        assert "--- starter.py" in board.stdout and "+++ best.py" in board.stdout
    out = runs / "export"
    exported = optagent("leaderboard", "--export", str(out), runs=runs)
    assert exported.returncode == 0
    submit = out / "flashattn_decode" / "cpu" / "submit.py"
    assert submit.read_text() == best and json.loads((submit.parent / "result.json").read_text())["status"] == "PASSED"
    missing = optagent("show", "no-such-run", runs=runs)
    assert missing.returncode == 2 and "no such run" in missing.stderr


def test_offline_run_proposes_knob_or_strategy_changes(tmp_path, task_dir):
    proc = optagent("run", str(task_dir), "--max-steps", "1", "--no-hidden", runs=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using the built-in offline planner" in proc.stdout
    run = only_run(tmp_path)
    got = ideas(run)
    assert len(got) == 2 and (got[1].startswith("knob ") or got[1].startswith("strategy "))


def test_sigkill_then_resume_loses_and_repeats_nothing(tmp_path, task_dir):
    scratch = tmp_path / "scratch"
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(tmp_path), "OPTAGENT_SCRATCH": str(scratch)}
    cmd = [sys.executable, "-m", "optagent.cli.main", "run", str(task_dir), "--planner", "replay", "--replay", str(REPLAY),
           "--no-hidden"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    target = None
    while time.monotonic() < deadline:
        found = list(tmp_path.glob("*/steps/0001/proposal.json"))
        if found:
            target = found[0]
            break
        time.sleep(0.2)
    assert target is not None, "the run never reached step 1"
    time.sleep(1.0)  # mid-evaluation of step 1
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = only_run(tmp_path)
    all_json_valid(run)
    assert not (run / "steps" / "0001" / "step.json").exists()
    assert ideas(run) == ["the starter kernel"]
    # state.json still says RUNNING, but nothing holds the run's lock: killed, and resumable
    assert RunState.model_validate_json((run / "state.json").read_text()).status.value == "RUNNING"
    listing = optagent("runs", runs=tmp_path)
    assert "INTERRUPTED" in listing.stdout and f"resumable: optagent resume {run.name}" in listing.stdout
    shown = optagent("show", run.name, runs=tmp_path)
    assert f"status INTERRUPTED (resumable: optagent resume {run.name})" in shown.stdout
    left = list(scratch.glob("eval-*"))  # the killed evaluation's scratch (and its lane's baseline job's, if one ran)
    assert left

    locked = subprocess.Popen([sys.executable, "-m", "optagent.cli.main", "resume", str(run)], env=env,  # by its path
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    second = optagent("resume", run.name, runs=tmp_path)
    assert second.returncode == 2 and "another optagent process" in second.stderr
    assert "RUNNING" in optagent("runs", runs=tmp_path).stdout
    out, err = locked.communicate(timeout=600)
    assert locked.returncode == 0, out + err
    assert not any(p.exists() for p in left) and not list(scratch.glob("eval-*"))  # swept on the resume's start
    assert "EXHAUSTED" in optagent("runs", runs=tmp_path).stdout
    all_json_valid(run)
    got = ideas(run)
    replies = [json.loads(line) for line in REPLAY.read_text().splitlines() if line.strip()]
    assert len(got) == 1 + len(replies)  # nothing lost, nothing repeated
    assert len(set(got)) == len(got)
    assert [p.parent.name for p in sorted(run.glob("steps/*/step.json"))] == [f"{i:04d}" for i in range(len(got))]


def test_resume_refuses_a_changed_task_unless_forced(tmp_path, task_dir):
    import shutil

    pkg = tmp_path / "pkg"
    shutil.copytree(task_dir, pkg)
    runs = tmp_path / "runs"
    first = optagent("run", str(pkg), "--max-steps", "0", "--no-hidden", runs=runs)
    assert first.returncode == 0, first.stderr
    run = only_run(runs)
    with (pkg / "xpuoj_problem" / "meta.json").open("a") as fh:
        fh.write("\n")
    refused = optagent("resume", run.name, runs=runs)
    assert refused.returncode == 2 and "changed" in refused.stderr and "--force" in refused.stderr
    forced = optagent("resume", run.name, "--force", runs=runs)
    assert forced.returncode == 0, forced.stderr


def to_thread(pid: int, sig: int) -> None:
    """sig to a thread of pid other than its main one (glibc's tgkill), else to the process."""
    threads = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    tgkill = getattr(ctypes.CDLL(None), "tgkill", None)
    if not threads or tgkill is None or tgkill(pid, threads[-1], sig) != 0:
        os.kill(pid, sig)


def test_ctrl_c_stops_cleanly_and_leaves_the_run_resumable(tmp_path, task_dir):
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "optagent.cli.main", "run", str(task_dir), "--planner", "replay", "--replay", str(REPLAY),
           "--no-hidden"]
    # A shell without job control starts a background job with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: the run is given the terminal's disposition, however pytest was started.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(tmp_path.glob("*/steps/0001/proposal.json")):
        time.sleep(0.2)
    time.sleep(1.0)
    # The kernel may hand a process-directed SIGINT to any thread: the hardest case is sent on purpose,
    # to one of the pool's threads while the main thread waits for the evaluation (it once deferred
    # Ctrl-C until the evaluation ended, and in CI a run went on to its end).
    signalled = time.monotonic()
    to_thread(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - signalled < 10, "Ctrl-C took effect only once the evaluation ended"
    run = only_run(tmp_path)
    all_json_valid(run)
    assert RunState.model_validate_json((run / "state.json").read_text()).status.value == "INTERRUPTED"
    assert "INTERRUPTED" in out
    # Scripts see the same state through --json.
    listing = optagent("runs", "--json", runs=tmp_path)
    assert json.loads(listing.stdout)[0]["state"]["status"] == "INTERRUPTED"
