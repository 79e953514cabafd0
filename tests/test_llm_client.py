"""The client for real endpoints: request timeout, max tokens and temperature, reasoning replies,
edits repaired inside the step, and the price table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai import FakeOpenAI, completion  # noqa: E402
from test_llm_planner import BAD_EDIT, GOOD, SOURCE, make_ctx  # noqa: E402

from optagent.app.build import build_planner  # noqa: E402
from optagent.cli.main import main  # noqa: E402
from optagent.llm.client import LLMError, OpenAICompatLLM  # noqa: E402
from optagent.llm.config import llm_settings_from_env  # noqa: E402
from optagent.llm.prices import known_prices  # noqa: E402
from optagent.llm.replies import split_reasoning  # noqa: E402
from optagent.schema import RunConfig  # noqa: E402
from optagent.search.planners.llm import LLMPlanner  # noqa: E402
from optagent.task import load_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tasks" / "flashattn_task_package"


@pytest.fixture(autouse=True)
def one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTAGENT_RETRY_BASE_S", "0.01")
    monkeypatch.setenv("OPTAGENT_RETRY_ATTEMPTS", "1")  # a timeout is seen once, not retried
    for name in ("OPTAGENT_PRICE_PROMPT", "OPTAGENT_PRICE_COMPLETION", "OPTAGENT_BASE_URL", "OPTAGENT_MODEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    yield fake
    fake.close()


def _config(server: FakeOpenAI, **kw) -> RunConfig:
    return RunConfig(run_id="r", task_dir=str(TASK), task_name="flashattn_decode", task_digest="d",
                     language="triton", device="cpu", planner="llm", model="fake-model", base_url=server.base_url,
                     timeout_s=60, min_gain=0.01, patience=5, max_steps=5, **kw)


# ---------------------------------------------------------------- the request timeout


@pytest.mark.parametrize("delay_s, timeout_s, answered", [(0.2, 1.0, True), (1.0, 0.3, False)])
def test_a_reply_is_waited_for_exactly_as_long_as_the_timeout(server: FakeOpenAI, delay_s: float, timeout_s: float,
                                                              answered: bool) -> None:
    """A server that answers after D seconds, a client that waits T: D < T is answered, D > T times out.
    The client has no other clock (openai's own retries are off, ours set to one attempt), so with the
    timeout reaching the HTTP client as configured (next test), a 200 s answer under --request-timeout
    300 is the D < T case, and the old fixed 120 s the D > T one, scaled down 1000x."""
    server.reply(GOOD, delay=delay_s)
    llm = OpenAICompatLLM(server.base_url, "fake-model", "k", timeout_s=timeout_s)
    if answered:
        assert llm.complete([{"role": "user", "content": "hi"}]).text == GOOD
    else:
        with pytest.raises(openai.APITimeoutError):
            llm.complete([{"role": "user", "content": "hi"}])


def test_request_timeout_max_tokens_and_temperature_reach_the_http_client(server: FakeOpenAI) -> None:
    planner = build_planner(_config(server, request_timeout_s=300, max_tokens=4096, temperature=0.2),
                            load_task(TASK))
    llm = planner.llm
    assert llm._client.timeout == 300  # what httpx is given for the request
    server.reply(GOOD)
    planner.propose(make_ctx())
    sent = server.requests[0]["json"]
    assert sent["max_tokens"] == 4096 and sent["temperature"] == 0.2
    default = build_planner(_config(server), load_task(TASK)).llm
    assert default._client.timeout == 600 and default.max_tokens is None
    server.reply(GOOD)
    default.complete([{"role": "user", "content": "hi"}])
    assert "temperature" not in server.requests[-1]["json"] and "max_tokens" not in server.requests[-1]["json"]


@pytest.mark.parametrize("option, value", [("--request-timeout", "0"), ("--max-tokens", "1.5"),
                                           ("--temperature", "-1")])
def test_bad_client_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture, option: str,
                                                value: str) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as stop:
        main(["run", str(TASK), "--runs-dir", str(runs), option, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and option in err and len(err.strip().splitlines()) == 1
    assert not runs.exists()


# ---------------------------------------------------------------- reasoning replies


def test_reasoning_content_is_not_the_answer(server: FakeOpenAI) -> None:
    body = completion(GOOD)
    body["choices"][0]["message"]["reasoning_content"] = "Let me think about BLOCK_N... " * 50
    server.reply(body=body)
    reply = OpenAICompatLLM(server.base_url, "fake-model", "k").complete([{"role": "user", "content": "x"}])
    assert reply.text == GOOD and reply.reasoning.startswith("Let me think")


def test_think_blocks_before_the_answer_are_stripped(server: FakeOpenAI) -> None:
    server.reply("<think>\nmaybe 64? no: <<<<<<< SEARCH is how edits look\n</think>\n\n" + GOOD)
    planner = LLMPlanner(OpenAICompatLLM(server.base_url, "fake-model", "k"))
    proposal = planner.propose(make_ctx())
    assert proposal.error is None and "BLOCK_N = 32" in proposal.source
    assert proposal.idea == "BLOCK_N 16 -> 32 to halve loop trips" and proposal.meta["reasoning_chars"] > 0


def test_a_reply_cut_off_while_thinking_says_so(server: FakeOpenAI) -> None:
    body = completion("<think>\nstill thinking about tiles")
    body["choices"][0]["finish_reason"] = "length"
    server.reply(body=body)
    with pytest.raises(LLMError, match=r"only reasoning, no answer \(finish_reason=length\) \(raise --max-tokens\)"):
        OpenAICompatLLM(server.base_url, "fake-model", "k").complete([{"role": "user", "content": "x"}])


def test_split_reasoning() -> None:
    assert split_reasoning("<think>a</think><think>b</think>\nanswer") == ("answer", "a\nb")
    assert split_reasoning("no thinking") == ("no thinking", "")
    assert split_reasoning("answer <think>inline</think>")[1] == ""  # only blocks before the answer


# ---------------------------------------------------------------- edits repaired within the step


def test_an_edit_that_misses_is_repaired_within_the_step(server: FakeOpenAI) -> None:
    server.reply(BAD_EDIT)
    server.reply(GOOD.replace("IDEA: BLOCK_N 16 -> 32 to halve loop trips\n", ""))
    planner = LLMPlanner(OpenAICompatLLM(server.base_url, "fake-model", "k"))
    proposal = planner.propose(make_ctx())
    assert proposal.error is None and "BLOCK_N = 32" in proposal.source
    assert proposal.idea == "more warps"  # the first reply's idea, the repair stating none
    assert proposal.meta["repairs"] == 1 and proposal.usage.requests == 2
    assert proposal.usage.prompt_tokens == 2000  # both requests counted
    repair = server.requests[1]["json"]["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == BAD_EDIT
    assert "repair 1 of 2" in repair[3]["content"] and "Nearest lines of the current kernel" in repair[3]["content"]
    assert "_decode[(triton.cdiv(n, BLOCK_N),)]" in repair[3]["content"]  # the line it should have copied
    assert planner._edit_failures == 0  # the next step is not told to send a whole file


def test_repairs_are_bounded_then_the_step_counts(server: FakeOpenAI) -> None:
    for _ in range(3):
        server.reply(BAD_EDIT)
    server.reply(GOOD)
    planner = LLMPlanner(OpenAICompatLLM(server.base_url, "fake-model", "k"))
    proposal = planner.propose(make_ctx())
    assert proposal.source is None and "SEARCH/REPLACE block 1 of 1" in proposal.error
    assert proposal.meta["repairs"] == 2 and len(server.requests) == 3 and proposal.usage.requests == 3
    assert planner._edit_failures == 1
    assert planner.propose(make_ctx()).source is not None  # the next step's reply applies
    assert "did not apply" in server.user_prompt(3)


def test_a_failed_repair_request_keeps_the_step(server: FakeOpenAI) -> None:
    server.reply(BAD_EDIT)
    server.reply(status=400, body={"error": {"message": "context too long"}})
    proposal = LLMPlanner(OpenAICompatLLM(server.base_url, "fake-model", "k")).propose(make_ctx())
    assert proposal.source is None and proposal.reply == BAD_EDIT and "context too long" in proposal.meta["repair_error"]
    assert SOURCE.split("\n")[0] in make_ctx().best_source


# ---------------------------------------------------------------- prices


def test_known_models_are_priced_and_the_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    assert known_prices("gpt-4o") == {"prompt_per_mtok": 2.5, "completion_per_mtok": 10.0}
    assert known_prices("openai/gpt-4o-mini-2024-07-18") == {"prompt_per_mtok": 0.15, "completion_per_mtok": 0.6}
    assert known_prices("gpt-4o2") is None and known_prices("my-local-model") is None
    assert llm_settings_from_env("http://x/v1", "deepseek-reasoner").prices == {
        "prompt_per_mtok": 0.55, "completion_per_mtok": 2.19}
    monkeypatch.setenv("OPTAGENT_PRICE_COMPLETION", "3")
    assert llm_settings_from_env("http://x/v1", "deepseek-reasoner").prices == {
        "prompt_per_mtok": 0.55, "completion_per_mtok": 3.0}
    assert llm_settings_from_env("http://x/v1", "my-local-model").prices == {
        "prompt_per_mtok": 0.0, "completion_per_mtok": 3.0}
    monkeypatch.delenv("OPTAGENT_PRICE_COMPLETION")
    assert llm_settings_from_env("http://x/v1", "my-local-model").prices is None
