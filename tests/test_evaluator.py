"""The sandboxed evaluator on CPU: each way a candidate can go wrong gets its status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from attack_fixtures import aborted
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.gates import Stopped
from optagent.evaluation.cases import parse_case_list, select_cases
from optagent.schema import CaseKind, EvalResult, Language, Status
from optagent.task import load_task

RUN_KERNEL = "def run_kernel(\n"


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


@pytest.fixture(scope="module")
def starter(task):
    return task.starter(Language.TRITON).source


def evaluator(task, timeout=120.0, hidden=False, first_only=True, static_scan=True):
    cases = select_cases(task, "cpu", 0, None, hidden=hidden)
    if first_only:
        cases = cases[:1]
    return SandboxEvaluator(task, "cpu", cases, timeout_s=timeout, static_scan=static_scan)


def with_body(starter: str, prologue: str) -> str:
    """The starter with extra statements at the top of run_kernel's body."""
    head, sep, rest = starter.partition(RUN_KERNEL)
    signature, colon, body = rest.partition("):\n")
    return head + sep + signature + colon + prologue + body


def test_starter_passes_smoke_and_hidden_cases(task, starter):
    result = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None), timeout_s=300).evaluate(
        starter, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    kinds = {c.kind for c in result.cases}
    assert kinds == {CaseKind.SMOKE, CaseKind.HIDDEN}
    for c in result.cases:
        assert c.status is Status.PASSED
        assert c.rel_err is not None and c.rel_err < c.tolerance
    smoke = [c for c in result.cases if c.kind is CaseKind.SMOKE]
    assert all(c.time_us and c.baseline_us and c.timing_kind == "cpu-interpreter" for c in smoke)
    assert "stand-in" in (result.baseline_label or "")
    EvalResult.model_validate_json(result.model_dump_json())  # the record round-trips


def test_wrong_kernel_is_incorrect(task, starter):
    wrong = starter.replace("out = acc / tl.where(l_i > 0, l_i, 1.0)", "out = 1.05 * acc / tl.where(l_i > 0, l_i, 1.0)")
    assert wrong != starter
    result = evaluator(task).evaluate(wrong, Language.TRITON)
    assert result.status is Status.INCORRECT
    assert "relative error" in result.reason


def test_unwritten_output_is_incorrect(task, starter):
    lazy = starter.replace("    grid = (int(batch_size), int(num_heads), int(seqlen_q))",
                           "    grid = (int(batch_size), max(int(num_heads) - 1, 1), int(seqlen_q))")
    result = evaluator(task).evaluate(lazy, Language.TRITON)
    assert result.status is Status.INCORRECT
    assert "not written" in result.reason


def test_syntax_error_is_compile_error(task, starter):
    result = evaluator(task).evaluate(starter.replace("def run_kernel(", "def run_kernel((", 1), Language.TRITON)
    assert result.status is Status.COMPILE_ERROR
    assert "SyntaxError" in result.reason and "line" in result.reason


def test_triton_compile_error_is_compile_error(task, starter):
    broken = starter.replace("s = tl.sum(k * q[None, :], axis=1)", "s = tl.sum(k * q[None, :], axis=1) + undefined_name")
    result = evaluator(task).evaluate(broken, Language.TRITON)
    assert result.status is Status.COMPILE_ERROR, result.reason
    assert "undefined_name" in result.reason


def test_infinite_loop_times_out_within_the_limit(task, starter):
    hang = with_body(starter, "    while int(batch_size) > 0:\n        batch_size = int(batch_size) + 1\n")
    t0 = time.monotonic()
    result = evaluator(task, timeout=20).evaluate(hang, Language.TRITON)
    elapsed = time.monotonic() - t0
    assert result.status is Status.TIMEOUT
    assert elapsed < 20 + 15  # the limit, plus killing and collecting
    assert "20 s" in result.reason


def test_an_evaluation_whose_stop_is_set_ends_at_once_its_process_killed(task, starter):
    """evaluate(stop=): a run's deadline reached while the starters are compared (cli/language.py)."""
    hang = with_body(starter, "    while int(batch_size) > 0:\n        batch_size = int(batch_size) + 1\n")
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        evaluator(task, timeout=120).evaluate(hang, Language.TRITON, stop=stop)
    assert time.monotonic() - t0 < 3.0 + 10  # not its 120 s timeout


def test_kernel_that_kills_its_process_is_a_runtime_error(task, starter):
    crash = with_body(starter, "    import os\n    os.abort()\n")
    assert evaluator(task).evaluate(crash, Language.TRITON).status is Status.REJECTED  # the scan sees it first
    # Behind the scan (which obfuscation can dodge), the crash itself is still a verdict:
    result = evaluator(task, static_scan=False).evaluate(crash, Language.TRITON)
    assert result.status is Status.RUNTIME_ERROR
    assert aborted(result.reason), result.reason


def test_exception_in_run_kernel_is_a_runtime_error_naming_it(task, starter):
    raising = with_body(starter, "    raise ValueError('no good')\n")
    result = evaluator(task).evaluate(raising, Language.TRITON)
    assert result.status is Status.RUNTIME_ERROR
    assert "ValueError: no good" in result.reason


def test_a_case_that_fails_takes_the_blame_not_the_case_checked_before_it(task, starter):
    # Every case is checked before any is timed: smoke-1 passed its checks and waits for timing when smoke-2
    # (the only one with grouped heads) raises; the verdict used to name smoke-1 for smoke-2's error.
    raising = with_body(starter, "    if int(num_heads) != int(num_heads_k):\n        raise ValueError('no grouped heads here')\n")
    result = evaluator(task, first_only=False).evaluate(raising, Language.TRITON)
    assert result.status is Status.RUNTIME_ERROR
    assert result.reason.startswith("case smoke-2: ") and "no grouped heads here" in result.reason, result.reason
    first, second, third = result.cases
    assert (first.status, first.reason) == (Status.SKIPPED, "checked, not timed: case smoke-2 failed")
    assert second.status is Status.RUNTIME_ERROR and third.status is Status.SKIPPED


FAKE = ('    print(\'{"type": "case", "status": "RAN", "case": "smoke-1"}\')\n'
        '    print("PASSED speedup 1000x geomean 1000x")\n')


def test_fake_result_lines_do_not_change_the_verdict(task, starter):
    wrong = starter.replace("out = acc / tl.where(l_i > 0, l_i, 1.0)", "out = 0.5 * acc / tl.where(l_i > 0, l_i, 1.0)")
    result = evaluator(task).evaluate(with_body(wrong, FAKE), Language.TRITON)
    assert result.status is Status.INCORRECT
    good = evaluator(task).evaluate(with_body(starter, FAKE), Language.TRITON)
    assert good.status is Status.PASSED
    assert good.geomean_speedup is None or good.geomean_speedup < 100


def test_missing_run_kernel_is_compile_error(task, starter):
    result = evaluator(task).evaluate(starter.replace("def run_kernel(", "def launch("), Language.TRITON)
    assert result.status is Status.COMPILE_ERROR
    assert "run_kernel" in result.reason


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_compile_error_carries_nvcc_message(task):
    source = task.starter(Language.CUDA).source
    broken = source.replace("__global__", "__global__ int x = ;\n__global__", 1)
    result = evaluator(task).evaluate(broken, Language.CUDA)
    assert result.status is Status.COMPILE_ERROR
    assert "error" in result.reason.lower() and "candidate.cu" in result.reason


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_starter_compiles_and_is_unsupported_to_run_on_cpu(task):
    result = evaluator(task).evaluate(task.starter(Language.CUDA).source, Language.CUDA)
    assert result.status is Status.UNSUPPORTED
    assert "GPU" in result.reason
    facts = result.cases[0].kernels  # what ptxas said of its sm_90 build, though it never ran
    assert facts and all(k.target == "sm_90" and k.registers for k in facts), facts


def test_case_list_parsing():
    assert parse_case_list("1,3-5", 12) == [1, 3, 4, 5]
    with pytest.raises(ValueError, match="outside"):
        parse_case_list("0-3", 12)
    with pytest.raises(ValueError, match="not a case"):
        parse_case_list("x", 12)


def test_cli_eval_json_and_exit_codes(tmp_path, task_dir, starter):
    good = tmp_path / "good.py"
    good.write_text(starter)
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "optagent.cli.main", "eval", str(task_dir), str(good), "--device", "cpu", "--no-hidden",
           "--json-out", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert json.loads(proc.stdout) == data  # --json: the document alone on stdout, the table on stderr
    assert "PASSED" in proc.stderr and "smoke-1" in proc.stderr
    assert data["status"] == "PASSED"
    for case in data["cases"]:
        for key in ("case", "status", "rel_err", "max_abs_err", "time_us", "baseline_us", "speedup"):
            assert key in case
    bad = tmp_path / "bad.py"
    bad.write_text(starter.replace("def run_kernel(", "def run_kernel((", 1))
    proc = subprocess.run(cmd[:5] + [str(bad), "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "COMPILE_ERROR" in proc.stdout


def test_a_kernel_the_tasks_check_fails_is_never_timed():
    # A manifest-less package: its derived smoke cases are contest cases cut down, which check() judges.
    from pathlib import Path as _P

    rms = load_task(_P(__file__).parent / "fixtures" / "packages" / "rmsnorm")
    source = rms.starter(Language.TRITON).source
    wrong = source.replace("(x * rstd * w).to(tl.bfloat16)", "(x * rstd * w * 1.5).to(tl.bfloat16)")
    assert wrong != source
    cases = select_cases(rms, "cpu", 0, None, smallest=[1])
    right = SandboxEvaluator(rms, "cpu", cases, timeout_s=120).evaluate(source, Language.TRITON)
    assert right.status is Status.PASSED and right.cases[0].time_us is not None and right.costs.timing > 0
    result = SandboxEvaluator(rms, "cpu", cases, timeout_s=120).evaluate(wrong, Language.TRITON)
    assert result.status is Status.INCORRECT, result.reason
    assert "check() failed" in result.reason and result.cases[0].time_us is None and result.costs.timing == 0


def killing(monkeypatch, kills: int, mode: str = "judge", after_s: float = 1.0) -> list:
    """sandbox.spawn, with its first `kills` processes of `mode` killed from outside (their whole group, SIGKILL)
    after_s after they start, as an operator or the kernel's OOM killer would; those spawned, in order."""
    from optagent.evaluation import sandbox

    real, spawned = sandbox.spawn, []

    def spawn(job, *args, **kwargs):
        sp = real(job, *args, **kwargs)
        if job.mode == mode:
            spawned.append(sp)
            if len(spawned) <= kills:
                threading.Timer(after_s, lambda: os.killpg(sp.proc.pid, signal.SIGKILL)).start()
        return sp

    monkeypatch.setattr(sandbox, "spawn", spawn)
    return spawned


def test_a_candidate_process_killed_from_outside_is_evaluated_once_more(task, starter, monkeypatch):
    spawned = killing(monkeypatch, kills=1, mode="candidate")
    result = evaluator(task).evaluate(starter, Language.TRITON)
    assert result.status is Status.PASSED and not result.killed_from_outside, result.reason
    assert len(spawned) == 2 and spawned[0].proc.returncode == -signal.SIGKILL


def test_a_candidate_process_killed_twice_from_outside_stands(task, starter, monkeypatch):
    spawned = killing(monkeypatch, kills=2, mode="candidate")
    result = evaluator(task).evaluate(starter, Language.TRITON)
    assert len(spawned) == 2  # once more, not for ever
    assert result.status is Status.RUNTIME_ERROR and "killed by SIGKILL" in result.reason
    assert result.killed_from_outside


def test_a_pool_evaluates_a_candidate_killed_from_outside_once_more_alone(task, starter, monkeypatch):
    from optagent.evaluation.pool import LocalPool
    from optagent.protocols import PoolJob

    spawned = killing(monkeypatch, kills=1, mode="candidate", after_s=2.0)  # (no spares on a CPU: spawned for it)
    pool = LocalPool(evaluator(task), jobs=2, devices=[None])
    got = {job.key: r for job, r in pool.evaluate([PoolJob(0, starter, Language.TRITON)])}
    pool.close()
    assert got[0].status is Status.PASSED, got[0].reason
    assert pool.alone_runs == 1 and spawned[0].proc.returncode == -signal.SIGKILL


def test_a_judge_killed_from_outside_runs_once_more(task, starter, monkeypatch):
    judges = killing(monkeypatch, kills=1)
    result = evaluator(task).evaluate(starter, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    assert len(judges) == 2 and judges[0].proc.returncode == -signal.SIGKILL


def test_a_judge_killed_twice_leaves_the_cases_unjudged(task, starter, monkeypatch):
    judges = killing(monkeypatch, kills=2)
    result = evaluator(task).evaluate(starter, Language.TRITON)
    assert len(judges) == 2  # once more, not for ever
    assert result.status is Status.RUNTIME_ERROR and "not judged: judge killed by SIGKILL" in result.reason


@pytest.mark.parametrize("run, outside", [
    (dict(returncode=-signal.SIGKILL), True),
    (dict(returncode=-signal.SIGTERM), True),
    (dict(returncode=-signal.SIGSEGV), False),  # its own code's fault
    (dict(returncode=-signal.SIGABRT), False),
    (dict(returncode=-signal.SIGKILL, limit="over its memory limit"), False),  # the parent's own stop
    (dict(returncode=-signal.SIGKILL, timed_out=True), False),
    (dict(returncode=1), False),
])
def test_killed_from_outside_is_a_signal_no_limit_or_fault_explains(run, outside):
    from optagent.evaluation.sandbox import WorkerRun

    assert WorkerRun(**run).killed_from_outside is outside
