"""What the model is told after a failure: the failing line and its source, every failing case,
the diff against the parent, the judge's tolerance, the accept rule and the re-time notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from optagent.app.build import prompt_rules
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation.verdict import candidate_line
from optagent.llm.feedback import Rules, error_line, failing_groups
from optagent.runs.view import Attempt, PlannerContext
from optagent.schema import CaseKind, CaseResult, Device, EvalResult, Language, RunConfig, Status
from optagent.search.planners.llm import LEDGER_MAX, build_messages
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tasks" / "flashattn_task_package"
RULES = Rules(tolerance_factor=4.0, min_tolerance=5e-3, min_gain=0.01, clear_gain=0.25, device="cuda")

KERNEL = """import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(o_ptr + offs, x * HEAD_DIM, mask=offs < n)


def run_kernel(x, o, n):
    _scale[(triton.cdiv(n, 64),)](x, o, n, BLOCK=64)
"""


def _result(status: Status, reason: Optional[str], cases: list[CaseResult], **kw: Any) -> EvalResult:
    return EvalResult(status=status, reason=reason, language=Language.TRITON, device="cuda", source_sha256="0" * 64,
                      cases=cases, wall_s=1.0, **kw)


def _passed(case: str, t: float) -> CaseResult:
    return CaseResult(case=case, kind=CaseKind.CONTEST, status=Status.PASSED, time_us=t, baseline_us=20.0,
                      tolerance=5e-3)


def _ctx(attempts: list[Attempt], best_source: str = KERNEL) -> PlannerContext:
    return PlannerContext(task_name="t", title="T", statement="rtol = atol = 1e-2", contract="c",
                          language=Language.TRITON, starter_source=KERNEL, best_source=best_source,
                          best_result=_result(Status.PASSED, None, [_passed("1", 10.0)]), attempts=attempts,
                          step_index=len(attempts))


def _user(ctx: PlannerContext, rules: Optional[Rules] = RULES) -> str:
    return build_messages(ctx, rules=rules)[1]["content"]


def test_a_real_cpu_compile_error_reaches_the_prompt_with_its_line_and_source() -> None:
    """The issue's NameError: Triton's interpreter raises it inside the jit function; the prompt
    after it names the line and shows that line's source text."""
    task = load_task(TASK)
    starter = task.starter(Language.TRITON).source
    bad_line = "        s = tl.sum(k * q[None, :], axis=1) + HEAD_DIM"
    broken = starter.replace("        s = tl.sum(k * q[None, :], axis=1)", bad_line, 1)
    assert broken != starter
    line = broken.split("\n").index(bad_line) + 1
    cases = select_cases(task, "cpu", 0, None, hidden=False)
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=120).evaluate(broken, Language.TRITON)
    assert result.status is Status.COMPILE_ERROR, result.reason
    assert f"(line {line})" in result.reason
    start = Attempt(0, "starter", "BASELINE", None, _result(Status.PASSED, None, [_passed("1", 10.0)]), starter)
    failed = Attempt(1, "use HEAD_DIM", "FAILED", result.reason, result, broken)
    prompt = _user(_ctx([start, failed], starter))
    assert f"The error is at line {line} of that candidate: `{bad_line.strip()}`" in prompt
    assert f">{line} | {bad_line}" in prompt  # the numbered window around it
    assert "+" + bad_line in prompt  # the diff against the parent (the starter)
    # the smoke cases it never reached are named, not silently dropped
    assert "Not run (2 cases: smoke-2, smoke-3)" in prompt


def test_triton_compilation_error_line_counts_from_the_def_line() -> None:
    # Triton's CompilationError numbers lines from the jit function's `def` (line 6 here: `def _scale`).
    message = ("CompilationError: at 6:31:\ndef _scale(x_ptr, o_ptr, n, BLOCK: tl.constexpr):\n"
               "    pid = tl.program_id(0)\n    offs = pid * BLOCK + tl.arange(0, BLOCK)\n"
               "    x = tl.load(x_ptr + offs, mask=offs < n)\n    tl.store(o_ptr + offs, x * HEAD_DIM, mask=offs < n)\n"
               "                               ^\nNameError(\"Cannot access global variable HEAD_DIM\")")
    assert error_line(message, KERNEL) == 10
    assert KERNEL.split("\n")[9].strip().startswith("tl.store(o_ptr + offs, x * HEAD_DIM")


@pytest.mark.parametrize("message, line", [
    ("candidate.cu(12): error: identifier \"HEAD_DIM\" is undefined", 12),
    ("candidate.cu:7:3: error: expected ';'", 7),
    ("SyntaxError: invalid syntax (line 3): def run_kernel((", 3),
    ("RuntimeError: no line here", None),
    ("SyntaxError: bad (line 999)", None),  # past the end of the source: not a line of it
])
def test_error_line_patterns(message: str, line: Optional[int]) -> None:
    assert error_line(message, KERNEL) == line


def test_candidate_line_takes_the_root_cause_of_a_chained_traceback() -> None:
    tb = ('Traceback (most recent call last):\n  File "/s/candidate_0_smoke-1.py", line 10, in _scale\n'
          "NameError: name 'HEAD_DIM' is not defined\n\n"
          "The above exception was the direct cause of the following exception:\n\n"
          'Traceback (most recent call last):\n  File "/x/optagent/worker/candidate.py", line 120, in _checked_runs\n'
          '  File "/s/candidate_0_smoke-1.py", line 14, in run_kernel\nInterpreterError: NameError(...)\n')
    assert candidate_line(tb) == 10
    assert candidate_line('  File "/x/optagent/worker/candidate.py", line 120, in run\n') is None


def test_every_failing_case_is_shown_and_identical_errors_collapse() -> None:
    wrong = [CaseResult(case=str(i), kind=CaseKind.CONTEST, status=Status.INCORRECT, rel_err=0.1 * i, tolerance=5e-3,
                        reason=f"relative error {0.1 * i:.2e} exceeds 5.00e-03 (given inputs)") for i in range(1, 8)]
    result = _result(Status.INCORRECT, wrong[0].reason, wrong)
    groups = failing_groups(result)
    assert len(groups) == 1 and groups[0]["count"] == 7
    prompt = _user(_ctx([Attempt(1, "fp16 acc", "FAILED", result.reason, result, KERNEL + "# changed\n")]))
    # the messages differ in their figures: grouped, but not called "the same error" (each case's figures listed)
    assert "INCORRECT on 7 cases (1, 2, 3, 4, 5, 6, 7), alike" in prompt and "the same error" not in prompt
    for i in range(1, 8):
        assert f"case {i}: rel_err {0.1 * i:.2e} vs tolerance 5.00e-03" in prompt
    same = [c.model_copy(update={"reason": "output #3 missing (given inputs)", "rel_err": None}) for c in wrong[:3]]
    result = _result(Status.INCORRECT, same[0].reason, same)
    prompt = _user(_ctx([Attempt(1, "fp16 acc", "FAILED", result.reason, result, KERNEL + "# changed\n", None, 2)]))
    assert "INCORRECT on 3 cases (1, 2, 3), the same error: output #3 missing" in prompt
    assert "Hidden cases (other shapes, not shown) failed too: 2 of them." in prompt


def test_the_judges_tolerance_and_the_accept_rule_are_always_stated() -> None:
    prompt = _user(_ctx([]))  # nothing has failed yet
    assert "max(0.005, 4 x that of the same computation done by PyTorch" in prompt
    assert "whatever tolerance the statement names" in prompt
    assert "more than 1% below the best's" in prompt and "above 25% and 3x the timing noise" in prompt
    assert "| tolerance |" in prompt and "| 5.0e-03 |" in prompt


def test_prompt_rules_come_from_the_package_and_the_run(tmp_path: Path) -> None:
    task = load_task(TASK)
    config = RunConfig(run_id="r", task_dir=str(TASK), task_name=task.name, task_digest="d", language="triton",
                       device="cpu", planner="llm", timeout_s=60, min_gain=0.03, patience=5, max_steps=5)
    rules = prompt_rules(config, task)
    assert (rules.tolerance_factor, rules.min_tolerance, rules.min_gain) == (4.0, 5e-3, 0.03)
    prompt = _user(_ctx([]), rules)
    assert "max(0.005, 4 x" in prompt and "more than 3% below" in prompt
    assert "A CPU run: no GPU is visible" in prompt and "Not known for this run" not in prompt


def test_retime_notes_of_the_last_comparisons_are_shown() -> None:
    note = "re-timed back to back: incumbent 10.0 us, candidate 7.6 us (geomean), gain +31.1%, noise 33.1%"
    ok = _result(Status.PASSED, None, [_passed("1", 7.6)])
    prompt = _user(_ctx([Attempt(3, "split-k", "NOT_BETTER", None, ok, KERNEL, retime_note=note)]))
    assert f"- step 3 (NOT_BETTER): {note}" in prompt
    assert f"Comparison with the best: {note}" in prompt


def test_the_prompt_stays_bounded_as_the_run_grows() -> None:
    def attempts(n: int) -> list[Attempt]:
        ok = _result(Status.PASSED, None, [_passed("1", 11.0)])
        return [Attempt(i, f"idea number {i} with some words", "ACCEPTED" if i % 50 == 0 else "NOT_BETTER", None,
                        ok, KERNEL) for i in range(1, n + 1)]

    small, big = _user(_ctx(attempts(LEDGER_MAX))), _user(_ctx(attempts(20 * LEDGER_MAX)))
    assert len(big) < len(small) + 2000  # a summary line, not 1140 more rows
    assert f"({20 * LEDGER_MAX - LEDGER_MAX} older attempts, not listed)" in big
    assert "Accepted among them: step 650: idea number 650" in big and "step 1100: idea number 1100" in big


def test_show_lists_tokens_per_request(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    from optagent.cli.main import main

    sample = Path(__file__).resolve().parent / "fixtures" / "run_sample"
    shutil.copytree(sample, tmp_path / "runs")
    step = next((tmp_path / "runs").glob("*/steps/0002/step.json"))
    text = step.read_text().replace('"requests": 0', '"requests": 2', 1)  # a step with one repair request
    step.write_text(text)
    assert main(["show", "--runs-dir", str(tmp_path / "runs"), "20260721"]) == 0
    out = capsys.readouterr().out
    assert "tokens in/out" in out and "9120/2870" in out  # step 1: one request
    assert "(x2 requests)" in out


def test_gpu_facts_in_the_prompt() -> None:
    from optagent.schema import GpuFacts

    ctx = _ctx([])
    ctx.gpu = GpuFacts(name="NVIDIA H200", sm_count=132, l2_mb=60.0, bandwidth_gbs=4100.0, smem_per_sm_kb=228.0,
                       bf16_tflops=720.0)
    prompt = _user(ctx)
    assert "NVIDIA H200, 132 SMs, 60 MB L2, measured memory bandwidth 4100 GB/s, 228 KiB shared memory per SM, " \
           "measured bf16 matrix-product rate 720 TFLOP/s" in prompt


def test_a_cpu_prompt_states_the_cpu_rule_and_no_interpreter_speedups() -> None:
    """What a model playing the planner met: the GPU accept rule above the CPU note, interpreter
    speedups such as 0.003x as the only effect of a passing attempt, the import rule told only after a
    rejection."""
    passed = _result(Status.PASSED, None, [_passed("smoke-1", 900000.0)]).model_copy(update={"device": Device.CPU})
    ctx = _ctx([Attempt(1, "exp2", "PASSED", None, passed, KERNEL + "# exp2\n")])
    ctx.on_cpu = True
    system, user = (m["content"] for m in build_messages(ctx, rules=RULES))
    assert "a kernel is accepted on correctness alone" in user
    assert "more than 1% below the best's" not in user and "0.000x" not in user
    assert "### Step 1 (PASSED): exp2" in user and "interpreter times rank nothing and are not shown" in user
    assert "time_us" not in user and "% of floor" not in user  # no interpreter times, no empty floor columns
    assert "- Import only " in system and "triton" in system.split("Import only")[1]
    assert "each attempt builds on the newest passing one" in user and "sm_90" in user  # the target, named
    gpu = _user(_ctx([]))
    assert "more than 1% below the best's" in gpu and "on this CPU run" not in gpu


def test_the_system_message_promises_hidden_cases_only_where_the_run_has_them() -> None:
    """A manifest-less package has no hidden cases: a model told they check other shapes relied on them."""
    without = build_messages(_ctx([]), rules=RULES)[0]["content"]
    assert "hidden cases" not in without and "nothing else checks other shapes" in without
    hidden = CaseResult(case="hidden-1", kind=CaseKind.HIDDEN, status=Status.PASSED)
    ctx = _ctx([])
    ctx.best_result = _result(Status.PASSED, None, [_passed("1", 10.0), hidden])
    system, user = (m["content"] for m in build_messages(ctx, rules=RULES))
    assert "on hidden cases with other shapes" in system
    assert "| hidden-1 |" not in user and "Hidden cases (other shapes, not shown): 1 of 1 passed" in user
