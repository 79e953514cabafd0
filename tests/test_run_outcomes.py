"""`optagent run` says how it ended, honestly, in its state and its exit code (README: exit codes).

0: a kernel passed and the run ended normally; 1: the run FAILED (nothing passed, or the planner
kept failing); 2: bad input, one line on stderr and no run left behind; 130: interrupted.
Driven through the real CLI in subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from fake_openai import FakeOpenAI
from optagent.llm.client import LLMUnreachable, OpenAICompatLLM
from optagent.schema import RunState, RunStatus

CONFIG = Path("xpuoj_problem") / "testcase_config.py"
STARTER = Path("starter") / "decode_triton.py"
LLM_ENV = ("OPTAGENT_BASE_URL", "OPTAGENT_MODEL", "OPTAGENT_API_KEY", "OPENAI_API_KEY", "OPTAGENT_PRICE_PROMPT",
           "OPTAGENT_PRICE_COMPLETION", "OPTAGENT_RETRY_ATTEMPTS", "OPTAGENT_RETRY_BASE_S")


def optagent(*args: str, runs: Path, env_extra: dict | None = None, timeout: float = 600):
    env = {k: v for k, v in os.environ.items() if k not in LLM_ENV}
    env.update({"OPTAGENT_RUNS_DIR": str(runs), **(env_extra or {})})
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("optagent: error: "), proc.stderr
    return lines[0]


def no_run_left(runs: Path) -> bool:
    return not runs.exists() or not any(runs.iterdir())


def the_run(runs: Path) -> tuple[Path, RunState]:
    (run,) = [p for p in runs.iterdir() if (p / "config.json").exists()]
    return run, RunState.model_validate_json((run / "state.json").read_text())


def copy_of(task_dir: Path, where: Path) -> Path:
    pkg = where / "pkg"
    shutil.copytree(task_dir, pkg)
    return pkg


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    yield fake
    fake.close()


# ---------------------------------------------------------------- nothing passed -> FAILED, exit 1


def test_a_starter_that_does_not_compile_fails_the_run_unless_a_candidate_fixes_it(tmp_path, task_dir):
    pkg = copy_of(task_dir, tmp_path)
    good = (pkg / STARTER).read_text()
    (pkg / STARTER).write_text(good.replace("    b = tl.program_id(0)\n", "    b = tl.program_id(0)\n    nope(b)\n", 1))
    runs = tmp_path / "runs"
    proc = optagent("run", str(pkg), "--max-steps", "0", "--no-hidden", runs=runs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _, state = the_run(runs)
    assert state.status is RunStatus.FAILED and state.best_step is None
    assert state.reason.startswith("no kernel passed: the starter failed: COMPILE_ERROR: ")
    assert "nope" in state.reason and "--max-steps 0" in state.reason
    assert f"FAILED: {state.reason}. 1 step" in proc.stdout and "CONVERGED" not in proc.stdout
    # an LLM could fix it: the run goes on after a failed starter, and a passing candidate is a normal end
    replies = tmp_path / "fix.jsonl"
    replies.write_text(json.dumps({"reply": f"IDEA: call no undefined helper\n```python\n{good}```\n"}) + "\n")
    fixed = optagent("run", str(pkg), "--planner", "replay", "--replay", str(replies), "--no-hidden",
                     runs=tmp_path / "runs2")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    _, state = the_run(tmp_path / "runs2")
    assert state.status is RunStatus.EXHAUSTED and state.best_step == 1 and "replayed" in state.reason


# ---------------------------------------------------------------- a package that does not load: exit 2, no run


@pytest.fixture(scope="module")
def probed_cache(tmp_path_factory, task_dir) -> Path:
    """A probe cache that already holds the good package's probe, as after an earlier run."""
    from optagent.evaluation.evaluator import probe_task
    from optagent.task import load_task

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPTAGENT_CACHE", str(cache))
        probe_task(load_task(task_dir), cached=True)
    assert list(cache.glob("probe/*.json"))
    return cache


BROKEN_CONFIG = {
    "syntax error": ("def getNumOfTestcases() -> int:", "def getNumOfTestcases( -> int:", "syntax error at line"),
    "no getNumOfTestcases": ("def getNumOfTestcases() -> int:", "def get_cases() -> int:",
                             "missing function(s): getNumOfTestcases"),
    "import error": ("from __future__ import annotations\n",
                     "from __future__ import annotations\nimport no_such_module_for_optagent\n",
                     "ModuleNotFoundError: No module named 'no_such_module_for_optagent'"),
    "raises on import": ("from __future__ import annotations\n",
                         "from __future__ import annotations\nraise RuntimeError('half-edited config')\n",
                         "half-edited config"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_CONFIG))
def test_a_package_that_does_not_load_is_one_line_before_step_0(tmp_path, task_dir, probed_cache, name):
    old, new, expected = BROKEN_CONFIG[name]
    pkg = copy_of(task_dir, tmp_path)
    text = (pkg / CONFIG).read_text()
    assert old in text
    (pkg / CONFIG).write_text(text.replace(old, new, 1))
    runs = tmp_path / "runs"
    proc = optagent("run", str(pkg), "--max-steps", "0", runs=runs, env_extra={"OPTAGENT_CACHE": str(probed_cache)})
    line = one_line_error(proc)
    assert str(pkg / CONFIG) in line and expected in line
    assert no_run_left(runs)


# ---------------------------------------------------------------- the LLM endpoint, checked once before step 0


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_unreachable_endpoint_is_one_line_and_quick(tmp_path, task_dir, how):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    runs = tmp_path / "runs"
    start = time.monotonic()
    optagent("runs", runs=runs)  # what starting the program costs on this host now (a loaded CI machine: seconds)
    startup = time.monotonic() - start
    start = time.monotonic()
    if how == "option":
        proc = optagent("run", str(task_dir), "--planner", "llm", "--base-url", url, "--model", "m", runs=runs)
    else:  # --planner auto picks the LLM planner from the environment
        proc = optagent("run", str(task_dir), runs=runs, env_extra={"OPTAGENT_BASE_URL": url, "OPTAGENT_MODEL": "m"})
    elapsed = time.monotonic() - start
    line = one_line_error(proc)
    assert f"{url}/models: cannot reach the LLM endpoint" in line and "refused" in line.lower()
    assert elapsed < startup + 8 and no_run_left(runs)  # no retries: one refused connection, one line


def test_a_refused_key_is_one_line(tmp_path, task_dir, server):
    server.models_status = 401
    proc = optagent("run", str(task_dir), "--planner", "llm", "--base-url", server.base_url, "--model", "fake-model",
                    runs=tmp_path / "runs")
    assert "HTTP 401" in one_line_error(proc) and server.requests == [] and no_run_left(tmp_path / "runs")


@pytest.mark.parametrize("status, reachable", [(200, True), (404, True), (405, True), (401, False), (403, False),
                                               (500, False), (503, False)])
def test_the_endpoint_check(server, status, reachable):
    server.models_status = status
    llm = OpenAICompatLLM(server.base_url, "fake-model", "sk-test")
    if reachable:
        llm.check()  # a server without /models (404) still answered
    else:
        with pytest.raises(LLMUnreachable, match=f"HTTP {status}"):
            llm.check()
    assert server.gets == ["/v1/models"]  # once: the check has no retries


def test_the_endpoint_check_times_out(monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    try:
        llm = OpenAICompatLLM(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "m", None)
        start = time.monotonic()
        with pytest.raises(LLMUnreachable, match="did not answer within 0.5 s"):
            llm.check(timeout_s=0.5)
        assert time.monotonic() - start < 5
    finally:
        listener.close()


def test_a_server_that_fails_every_request_ends_the_run_failed(tmp_path, task_dir, server):
    server.always = {"status": 500, "body": {"error": {"message": "the model is down"}}}
    runs = tmp_path / "runs"
    proc = optagent("run", str(task_dir), "--planner", "llm", "--base-url", server.base_url, "--model", "fake-model",
                    "--no-hidden", runs=runs,
                    env_extra={"OPTAGENT_RETRY_BASE_S": "0.01", "OPTAGENT_RETRY_ATTEMPTS": "2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run, state = the_run(runs)
    assert state.status is RunStatus.FAILED and state.steps == 4  # the starter, then three planner failures
    assert state.reason.startswith("the planner failed 3 times in a row, last: InternalServerError")
    assert state.best_step == 0 and (run / "best").is_dir()  # the starter passed and is kept
    assert len(server.requests) == 3 * 2 and server.gets == ["/v1/models"]
    assert "CONVERGED" not in proc.stdout and f"FAILED: {state.reason}" in proc.stdout


# ---------------------------------------------------------------- bad values: one line, exit 2, no run


BAD_OPTIONS = {
    "--timeout -5": (["--timeout", "-5"], "--timeout: must be a positive number of seconds, got -5"),
    "--timeout 0": (["--timeout", "0"], "--timeout: must be a positive number of seconds, got 0"),
    "--timeout nan": (["--timeout", "nan"], "--timeout: must be a positive number of seconds, got nan"),
    "--patience -1": (["--patience", "-1"], "--patience: must be a whole number of steps >= 1, got -1"),
    "--max-steps -1": (["--max-steps", "-1"], "--max-steps: must be a whole number of steps >= 0, got -1"),
    "--max-steps 2.5": (["--max-steps", "2.5"], "--max-steps: must be a whole number of steps >= 0, got 2.5"),
    "--min-gain -0.1": (["--min-gain", "-0.1"], "--min-gain: must be a number >= 0, got -0.1"),
    "--time-limit 0": (["--time-limit", "0"], "--time-limit: must be a positive number of seconds, got 0"),
    "--budget-usd -1": (["--budget-usd", "-1"], "--budget-usd: must be a number >= 0, got -1"),
    "--planner nope": (["--planner", "nope"], "--planner: invalid choice: 'nope'"),
    "--width 0": (["--width", "0"], "--width: must be a whole number of candidates >= 1, got 0"),
    "--width 1.5": (["--width", "1.5"], "--width: must be a whole number of candidates >= 1, got 1.5"),
}


@pytest.mark.parametrize("name", sorted(BAD_OPTIONS))
def test_a_bad_option_is_one_line(tmp_path, task_dir, name):
    args, expected = BAD_OPTIONS[name]
    proc = optagent("run", str(task_dir), *args, runs=tmp_path / "runs")
    line = one_line_error(proc)
    assert line.startswith(f"optagent: error: {expected}") and (name == "--planner nope" or line.endswith(expected))
    assert no_run_left(tmp_path / "runs")


def test_eval_checks_its_timeout_too(tmp_path, task_dir):
    proc = optagent("eval", str(task_dir), str(task_dir / STARTER), "--timeout", "-5", runs=tmp_path)
    assert one_line_error(proc) == "optagent: error: --timeout: must be a positive number of seconds, got -5"


BAD_ENV = {
    "OPTAGENT_PRICE_PROMPT": ("abc", "OPTAGENT_PRICE_PROMPT='abc': must be a price in USD per million tokens"),
    "OPTAGENT_PRICE_COMPLETION": ("-1", "OPTAGENT_PRICE_COMPLETION='-1': must be a price in USD per million"),
    "OPTAGENT_RETRY_ATTEMPTS": ("0", "OPTAGENT_RETRY_ATTEMPTS='0': must be a whole number of attempts, at least 1"),
    "OPTAGENT_RETRY_BASE_S": ("soon", "OPTAGENT_RETRY_BASE_S='soon': must be a number of seconds >= 0"),
}


@pytest.mark.parametrize("name", sorted(BAD_ENV))
@pytest.mark.parametrize("planner", ["offline", "llm"])
def test_a_bad_environment_value_is_one_line(tmp_path, task_dir, server, name, planner):
    value, expected = BAD_ENV[name]
    args = ["--planner", "llm", "--base-url", server.base_url, "--model", "fake-model"] if planner == "llm" else []
    proc = optagent("run", str(task_dir), *args, runs=tmp_path / "runs", env_extra={name: value})
    assert expected in one_line_error(proc) and no_run_left(tmp_path / "runs")
    assert server.requests == []


def test_a_runs_dir_that_is_a_file_is_one_line(tmp_path, task_dir):
    file = tmp_path / "runs"
    file.write_text("not a folder")
    line = one_line_error(optagent("run", str(task_dir), runs=file))
    assert line == f"optagent: error: OPTAGENT_RUNS_DIR={file}: not a directory"
    line = one_line_error(optagent("run", str(task_dir), "--runs-dir", str(file / "below"), runs=tmp_path / "x"))
    assert line == f"optagent: error: --runs-dir {file / 'below'}: {file} is not a directory"
    assert file.read_text() == "not a folder"


def test_a_missing_replay_file_is_one_line(tmp_path, task_dir):
    missing = tmp_path / "none.jsonl"
    line = one_line_error(optagent("run", str(task_dir), "--planner", "replay", "--replay", str(missing),
                                   runs=tmp_path / "runs"))
    assert str(missing) in line and "No such file" in line and no_run_left(tmp_path / "runs")
