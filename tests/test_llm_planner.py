"""The LLM planner against a real local HTTP server speaking the chat-completions protocol."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import openai
import pytest

from fake_openai import FakeOpenAI, completion
from optagent.llm.client import LLMError, OpenAICompatLLM
from optagent.llm.config import llm_settings_from_env
from optagent.search.planners.llm import LLMPlanner, build_messages
from optagent.search.planners.replay import ReplayPlanner
from optagent.llm.prompts import render
from optagent.protocols import LLM, Planner, PlannerExhausted
from optagent.runs.view import Attempt, PlannerContext
from optagent.schema import GpuFacts
from optagent.schema import CaseKind, CaseResult, EvalResult, Language, Status

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "replay_decode.jsonl"
STARTER = ROOT / "tasks" / "flashattn_task_package" / "starter" / "decode_triton.py"

SOURCE = """import triton
import triton.language as tl

BLOCK_N = 16  # knob: 16, 32, 64


@triton.jit
def _decode(q_ptr, k_ptr, o_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(q_ptr + offs, mask=offs < n), mask=offs < n)


def run_kernel(q, k, o, n):
    _decode[(triton.cdiv(n, BLOCK_N),)](q, k, o, n, BLOCK=BLOCK_N, num_warps=4)
    return o
"""

GOOD = ("IDEA: BLOCK_N 16 -> 32 to halve loop trips\n\n<<<<<<< SEARCH\nBLOCK_N = 16  # knob: 16, 32, 64\n"
        "=======\nBLOCK_N = 32  # knob: 16, 32, 64\n>>>>>>> REPLACE\n")
BAD_EDIT = ("IDEA: more warps\n\n<<<<<<< SEARCH\n    _decode[grid](q, k, o, n, BLOCK=BLOCK_N, num_warps=4)\n"
            "=======\n    _decode[grid](q, k, o, n, BLOCK=BLOCK_N, num_warps=8)\n>>>>>>> REPLACE\n")
WHOLE = f"IDEA: rewrite with 8 warps\n```python\n{SOURCE.replace('num_warps=4', 'num_warps=8')}```\n"


# ---------------------------------------------------------------- the fake server (tests/fake_openai.py)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTAGENT_RETRY_BASE_S", "0.01")
    monkeypatch.setenv("OPTAGENT_RETRY_ATTEMPTS", "3")


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    yield fake
    fake.close()


def make_llm(server: FakeOpenAI, timeout_s: float = 5.0) -> OpenAICompatLLM:
    return OpenAICompatLLM(server.base_url, "fake-model", "sk-test", timeout_s=timeout_s,
                           prices={"prompt_per_mtok": 2.0, "completion_per_mtok": 8.0})


# ---------------------------------------------------------------- the context


def _case(case: str, time_us: float, **kw: Any) -> CaseResult:
    return CaseResult(case=case, kind=CaseKind.CONTEST, status=Status.PASSED, sizes=f"b=4 s={case}00",
                      time_us=time_us, baseline_us=20.0, floor_us=5.0, **kw)


def _result(status: Status = Status.PASSED, reason: Optional[str] = None,
            cases: Optional[list[CaseResult]] = None, **kw: Any) -> EvalResult:
    return EvalResult(status=status, reason=reason, language=Language.TRITON, device="cuda",
                      device_name="NVIDIA H200", source_sha256="0" * 64,
                      cases=cases if cases is not None else [_case("1", 10.0), _case("2", 40.0)],
                      wall_s=1.0, **kw)


def make_ctx() -> PlannerContext:
    compile_log = "\n".join(f"compile line {i}" for i in range(100))
    wrong = CaseResult(case="2", kind=CaseKind.CONTEST, status=Status.INCORRECT, sizes="b=4 s=200",
                       reason="rel_err 0.3 exceeds 0.002", rel_err=0.3, tolerance=0.002)
    return PlannerContext(
        task_name="flashattn_decode", title="Paged decode attention",
        statement="Compute single-token decode attention over a paged KV cache.",
        contract="def run_kernel(q, k, o, n) -> o", language=Language.TRITON,
        starter_source=SOURCE, best_source=SOURCE, best_result=_result(),
        attempts=[
            Attempt(0, "starter", "BASELINE", None, _result()),
            Attempt(1, "unroll the loop by hand", "FAILED", None,
                    _result(Status.COMPILE_ERROR, compile_log, cases=[])),
            Attempt(2, "fp16 accumulation", "FAILED", None,
                    _result(Status.INCORRECT, "case 2 incorrect", cases=[_case("1", 9.0), wrong])),
            Attempt(3, "num_warps 4 -> 2", "NOT_BETTER", None, _result(cases=[_case("1", 11.0)])),
            Attempt(4, "swap loops", "NO_KERNEL", "SEARCH/REPLACE block 1 of 1: not found\nnearest ...", None),
        ],
        gpu=GpuFacts(name="NVIDIA H200", sm_count=132, l2_mb=60.0, bandwidth_gbs=4100.0), step_index=5,
    )


@pytest.fixture
def ctx() -> PlannerContext:
    return make_ctx()


# ---------------------------------------------------------------- tests


def test_protocols_are_implemented(server: FakeOpenAI) -> None:
    llm = make_llm(server)
    assert isinstance(llm, LLM) and isinstance(LLMPlanner(llm), Planner)
    assert isinstance(ReplayPlanner(FIXTURE), Planner)
    assert LLMPlanner(llm).model == "fake-model" and LLMPlanner(llm).name == "llm"


def test_good_reply_applies_and_records_usage(server: FakeOpenAI, ctx: PlannerContext) -> None:
    server.reply(GOOD)
    proposal = LLMPlanner(make_llm(server)).propose(ctx)
    assert proposal.error is None and "BLOCK_N = 32  # knob" in proposal.source
    assert proposal.idea == "BLOCK_N 16 -> 32 to halve loop trips" and proposal.reply == GOOD
    assert proposal.usage.prompt_tokens == 1000 and proposal.usage.completion_tokens == 500
    assert proposal.usage.cost_usd == pytest.approx(1000 * 2.0 / 1e6 + 500 * 8.0 / 1e6)
    assert proposal.meta["reply_kind"] == "edits" and not proposal.meta["whole_file_requested"]
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test"
    assert request["json"]["model"] == "fake-model"
    assert request["json"]["messages"] == proposal.request
    assert [m["role"] for m in proposal.request] == ["system", "user"]
    prompt = server.user_prompt(0)
    assert "| 2 | b=4 s=200 | 40.00 | 20.00 | 0.500 | 12.5 | memory |" in prompt  # case table
    assert "132 SMs" in prompt and "60 MB L2" in prompt and "4100 GB/s" in prompt
    assert "### Step 3 (NOT_BETTER): num_warps 4 -> 2" in prompt  # every attempt in detail: no ledger table too
    assert "## Ideas tried so far" not in prompt
    assert "lines cut" in prompt and "compile line 99" in prompt  # compile error trimmed, tail kept
    assert "case 2: rel_err 3.00e-01 vs tolerance 2.00e-03" in prompt  # failing case
    assert "Compute single-token decode attention" in prompt and "def run_kernel(q, k, o, n)" in prompt


def test_case_table_takes_the_larger_floor(server: FakeOpenAI, ctx: PlannerContext) -> None:
    """A compute-bound case (flops / matmul rate above bytes / bandwidth) is measured against
    its compute floor, and the prompt says which floor applies."""
    import dataclasses

    ctx = dataclasses.replace(ctx, best_result=_result(cases=[_case("1", 10.0),
                                                               _case("2", 40.0, compute_floor_us=30.0)]))
    c = ctx.best_result.cases[1]
    assert (c.hw_floor_us, c.bound, c.pct_of_floor) == (30.0, "compute", 75.0)
    server.reply(GOOD)
    LLMPlanner(make_llm(server)).propose(ctx)
    prompt = server.user_prompt(0)
    assert "| 1 | b=4 s=100 | 10.00 | 20.00 | 2.000 | 50.0 | memory |" in prompt
    assert "| 2 | b=4 s=200 | 40.00 | 20.00 | 0.500 | 75.0 | compute |" in prompt


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_error_then_success_is_retried(server: FakeOpenAI, ctx: PlannerContext, status: int) -> None:
    server.reply(status=status, body={"error": {"message": "busy"}})
    server.reply(GOOD)
    proposal = LLMPlanner(make_llm(server)).propose(ctx)
    assert proposal.source is not None and len(server.requests) == 2


def test_retries_are_bounded_by_the_one_policy(server: FakeOpenAI, ctx: PlannerContext,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTAGENT_RETRY_ATTEMPTS", "2")
    for _ in range(3):
        server.reply(status=429, body={"error": {"message": "slow down"}})
    with pytest.raises(openai.RateLimitError):
        LLMPlanner(make_llm(server)).propose(ctx)
    assert len(server.requests) == 2  # the openai client itself does not retry


def test_client_errors_are_not_retried(server: FakeOpenAI, ctx: PlannerContext) -> None:
    server.reply(status=400, body={"error": {"message": "bad request"}})
    with pytest.raises(openai.BadRequestError):
        LLMPlanner(make_llm(server)).propose(ctx)
    assert len(server.requests) == 1


@pytest.mark.parametrize("entry, match", [
    ({"body": completion("x", choices=False)}, "no choices"),
    ({"body": completion(None)}, "no message content"),
    ({"body": b"<html>gateway</html>"}, "not JSON"),
    ({"body": b"plain text", "content_type": "text/plain"}, "not a chat completion"),
])
def test_malformed_reply_raises_llm_error(server: FakeOpenAI, ctx: PlannerContext,
                                          entry: dict, match: str) -> None:
    server.script.append({"status": 200, **entry})
    with pytest.raises(LLMError, match=match):
        LLMPlanner(make_llm(server)).propose(ctx)
    assert len(server.requests) == 1  # a malformed answer would come back the same: no retry


def test_failed_edits_feed_back_then_ask_for_whole_file(server: FakeOpenAI, ctx: PlannerContext) -> None:
    planner = LLMPlanner(make_llm(server), max_edit_failures=2, max_repairs=0)  # across steps, not within one
    for reply in (BAD_EDIT, BAD_EDIT, WHOLE, GOOD):
        server.reply(reply)
    first = planner.propose(ctx)
    assert first.source is None and first.idea == "more warps" and first.reply == BAD_EDIT
    assert "block 1 of 1" in first.error and "not found" in first.error
    nearest = ">15 |     _decode[(triton.cdiv(n, BLOCK_N),)](q, k, o, n, BLOCK=BLOCK_N, num_warps=4)"
    assert nearest in first.error
    assert first.usage.prompt_tokens == 1000 and first.request is not None

    second = planner.propose(ctx)
    assert second.error is not None and nearest in server.user_prompt(1)
    assert "1 failed edit in a row" in server.user_prompt(1)
    assert "complete kernel file" not in server.user_prompt(1)

    third = planner.propose(ctx)  # two failures in a row: the prompt asks for the whole file
    assert third.meta["whole_file_requested"] and "2 failed edits in a row" in server.user_prompt(2)
    assert "complete kernel file in one ```python code block" in server.user_prompt(2)
    assert third.source is not None and "num_warps=8" in third.source and third.meta["reply_kind"] == "file"

    fourth = planner.propose(ctx)  # success resets the count and clears the feedback
    assert fourth.source is not None and not fourth.meta["whole_file_requested"]
    assert "did not apply" not in server.user_prompt(3)


def test_reply_without_kernel_is_a_proposal_error(server: FakeOpenAI, ctx: PlannerContext) -> None:
    planner = LLMPlanner(make_llm(server), max_edit_failures=1)
    server.reply("I think BLOCK_N should be larger, but I am not sure.")
    server.reply(GOOD)
    proposal = planner.propose(ctx)
    assert proposal.source is None and "neither SEARCH/REPLACE blocks nor" in proposal.error
    assert proposal.idea == "I think BLOCK_N should be larger, but I am not sure."
    planner.propose(ctx)
    assert "held no usable kernel" in server.user_prompt(1)
    assert "complete kernel file in one" not in server.user_prompt(1)  # not an edit failure


def test_timeout_then_success(server: FakeOpenAI, ctx: PlannerContext) -> None:
    server.reply(GOOD, delay=1.5)
    server.reply(GOOD)
    start = time.monotonic()
    proposal = LLMPlanner(make_llm(server, timeout_s=0.3)).propose(ctx)
    assert proposal.source is not None and len(server.requests) == 2
    assert time.monotonic() - start < 2.0


def test_timeouts_exhaust_the_retries(server: FakeOpenAI, ctx: PlannerContext) -> None:
    for _ in range(3):
        server.reply(GOOD, delay=1.5)
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        LLMPlanner(make_llm(server, timeout_s=0.3)).propose(ctx)
    assert len(server.requests) == 3 and time.monotonic() - start < 3.0


def test_prompts_render_a_bare_context() -> None:
    bare = PlannerContext(task_name="t", title="T", statement="s", contract="c", language=Language.CUDA,
                          starter_source="x", best_source="x", best_result=None)
    system, user = (m["content"] for m in build_messages(bare))
    assert "```cuda" in system and "an NVIDIA GPU" in system
    assert "not been evaluated yet" in user and "Not known for this run" in user and "first attempt" in user


def test_prompts_dir_can_be_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hello.j2").write_text("hi {{ who }}\n")
    monkeypatch.setenv("OPTAGENT_PROMPTS_DIR", str(tmp_path))
    assert render("hello", who="there") == "hi there\n"
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        render("hello")


def test_llm_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPTAGENT_BASE_URL", "OPTAGENT_MODEL", "OPTAGENT_API_KEY", "OPENAI_API_KEY",
                 "OPTAGENT_PRICE_PROMPT", "OPTAGENT_PRICE_COMPLETION"):
        monkeypatch.delenv(name, raising=False)
    assert llm_settings_from_env(None, None) is None
    assert llm_settings_from_env("http://x/v1", None) is None
    monkeypatch.setenv("OPTAGENT_MODEL", "m")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert llm_settings_from_env("http://x/v1", None) == ("http://x/v1", "m", "sk-openai", None)
    monkeypatch.setenv("OPTAGENT_BASE_URL", "http://env/v1")
    monkeypatch.setenv("OPTAGENT_API_KEY", "sk-optagent")
    monkeypatch.setenv("OPTAGENT_PRICE_PROMPT", "3")
    settings = llm_settings_from_env(None, "other")
    assert settings == ("http://env/v1", "other", "sk-optagent",
                        {"prompt_per_mtok": 3.0, "completion_per_mtok": 0.0})
    monkeypatch.setenv("OPTAGENT_PRICE_COMPLETION", "cheap")
    with pytest.raises(ValueError, match="OPTAGENT_PRICE_COMPLETION"):
        llm_settings_from_env(None, None)


# ---------------------------------------------------------------- replay


def _no_attempts(ctx: PlannerContext) -> PlannerContext:
    # The replay planner resumes after the steps a context records; these tests start fresh.
    return PlannerContext(**{**ctx.__dict__, "attempts": [ctx.attempts[0]]})


def test_replay_resumes_after_recorded_steps(ctx: PlannerContext) -> None:
    planner = ReplayPlanner(FIXTURE)
    resumed = PlannerContext(**{**ctx.__dict__, "attempts": ctx.attempts[:3]})  # starter + 2 replies done
    third = planner.propose(resumed)
    assert third.source is not None and "BLOCK_N = 64  # knob" in third.source


def test_replay_fixture_applies_like_the_llm_planner(ctx: PlannerContext) -> None:
    ctx = _no_attempts(ctx)
    planner = ReplayPlanner(FIXTURE)
    assert planner.name == "replay" and planner.model is None
    first = planner.propose(ctx)
    assert first.source is not None and "BLOCK_N = 32  # knob: 16, 32, 64" in first.source
    assert first.idea.startswith("BLOCK_N 16 -> 32") and first.usage.cost_usd == 0.0
    second = planner.propose(ctx)
    assert second.source is None and ">4 | BLOCK_N = 16  # knob: 16, 32, 64" in second.error
    assert second.idea == "BLOCK_N 16 -> 8 (an edit that does not apply)"
    third = planner.propose(ctx)  # against the starter (the first was not accepted here)
    assert third.source is not None and "BLOCK_N = 64  # knob" in third.source
    with pytest.raises(PlannerExhausted):
        planner.propose(ctx)


@pytest.mark.skipif(not STARTER.is_file(), reason="the Triton decode starter is not written yet")
def test_replay_fixture_applies_to_the_real_decode_starter(ctx: PlannerContext) -> None:
    source = STARTER.read_text()
    real = PlannerContext(**{**_no_attempts(ctx).__dict__, "starter_source": source, "best_source": source})
    planner = ReplayPlanner(FIXTURE)
    first, second = planner.propose(real), planner.propose(real)
    assert first.source is not None and "BLOCK_N = 32" in first.source
    assert second.error is not None
    assert planner.propose(real).source is not None


def test_replay_reads_a_json_list(tmp_path: Path, ctx: PlannerContext) -> None:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps([GOOD, {"reply": "no code here", "idea": "nothing"}]))
    ctx = _no_attempts(ctx)
    planner = ReplayPlanner(path)
    assert planner.propose(ctx).source is not None
    empty = planner.propose(ctx)
    assert empty.error is not None and empty.idea == "nothing"
    with pytest.raises(PlannerExhausted):
        planner.propose(ctx)


# ---------------------------------------------------------------- rounds: K requests at once, each its own slot


class BarrierLLM:
    """Answers only once ``n`` requests are in flight together: a planner that asks one at a time times out."""

    model = "fake-model"

    def __init__(self, n: int, fail_on: str = "") -> None:
        import threading

        self.barrier, self.fail_on, self.prompts = threading.Barrier(n, timeout=10), fail_on, []

    def complete(self, messages: list[dict]):
        from optagent.protocols import LLMReply
        from optagent.schema import Usage

        self.prompts.append(messages[1]["content"])
        self.barrier.wait()
        if self.fail_on and self.fail_on in messages[1]["content"]:
            raise LLMError("the endpoint failed for this slot")
        return LLMReply(GOOD, Usage(prompt_tokens=7))


def round_ctxs(on_cpu: bool = False) -> list[PlannerContext]:
    import dataclasses

    base = make_ctx()
    lineage = [Attempt(0, "starter", "BASELINE", None, _result()),
               Attempt(3, "num_warps 4 -> 2", "NOT_BETTER", None, _result(cases=[_case("1", 11.0)]))]
    siblings = [Attempt(6, "split the sequence across blocks", "FAILED", None, _result(Status.TIMEOUT, "too slow",
                                                                                          cases=[]))]
    parents = [0, 3, 0]
    return [dataclasses.replace(base, step_index=5 + k, parent_step=p, incumbent_step=0,
                                incumbent_result=_result(), slot=k, width=3, round_parents=parents,
                                lineage=lineage if p == 3 else lineage[:1], siblings=siblings if p == 3 else [],
                                on_cpu=on_cpu)
            for k, p in enumerate(parents)]


def test_a_round_sends_its_requests_at_once_each_steered_its_own_way() -> None:
    llm = BarrierLLM(3)
    got = LLMPlanner(llm).propose_round(round_ctxs())
    assert all(not isinstance(p, Exception) and p.source and "BLOCK_N = 32" in p.source for p in got)
    by_slot = {int(text.split("You write attempt ")[1].split(" ")[0]): text for text in llm.prompts}
    assert sorted(by_slot) == [1, 2, 3]
    directions = {text.split("favour this one: ")[1].split("\n")[0] for text in by_slot.values()}
    assert len(directions) == 3  # a different direction for each slot
    branch = by_slot[2]  # from step 3, not the incumbent: its parent, lineage and siblings are shown
    assert "## The kernel to improve: step 3's" in branch and "the run's best (step 0" in branch
    assert "- step 3: num_warps 4 -> 2" in branch and "| 6 | split the sequence across blocks | FAILED" in branch
    assert "from steps 0" in branch or "from step 0" in branch
    assert "## The kernel to improve: step 0's" in by_slot[1] and "the run's best" in by_slot[1] and "Other attempts from this same kernel" not in by_slot[1]
    assert "Triton's CPU interpreter" not in by_slot[1]


def test_a_failed_request_is_its_slot_outcome_and_cpu_runs_are_told_times_are_not_gpu_times() -> None:
    llm = BarrierLLM(3, fail_on="You write attempt 2 of 3")
    planner = LLMPlanner(llm)
    got = planner.propose_round(round_ctxs(on_cpu=True))
    assert isinstance(got[1], LLMError) and not isinstance(got[0], Exception) and not isinstance(got[2], Exception)
    assert all("checks correctness, not speed" in text for text in llm.prompts)
    user = build_messages(round_ctxs(on_cpu=True)[0])[1]["content"]
    assert "a kernel is accepted on correctness alone" in user and "the best stays the first kernel that passed" in user
