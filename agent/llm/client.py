"""An OpenAI-compatible chat-completions client implementing the LLM protocol."""

from __future__ import annotations

from typing import Optional

import openai

from optagent.text import first_line
from optagent.protocols import LLMReply
from optagent.llm.replies import split_reasoning
from optagent.retries import llm_retry
from optagent.schema import Usage

# Some local servers (vLLM, llama.cpp) ignore the key, but the client insists on one.
_NO_KEY = "no-key"


class LLMError(Exception):
    """The server answered, but not with a usable chat completion."""


class LLMUnreachable(Exception):
    """The endpoint cannot serve a run (no connection, a refused key, a failing server); one line."""


# Answers that mean the request will never be served: a refused key (401/403/407) or a failing server.
_REFUSED = (401, 403, 407)


def _root_cause(exc: BaseException) -> str:
    """The innermost error's text: openai's 'Connection error.' hides 'Connection refused' below it."""
    inner: BaseException = exc
    for _ in range(20):  # a chain can loop
        below = inner.__cause__ or inner.__context__
        if below is None:
            break
        inner = below
    return first_line(str(inner), 200) or type(inner).__name__


def cost_usd(prices: Optional[dict], prompt_tokens: int, completion_tokens: int) -> float:
    """Cost of one call from prices in USD per million tokens; 0 when unpriced."""
    if not prices:
        return 0.0
    return (prompt_tokens * float(prices.get("prompt_per_mtok", 0.0))
            + completion_tokens * float(prices.get("completion_per_mtok", 0.0))) / 1e6


class OpenAICompatLLM:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: Optional[str],
        timeout_s: float = 600,
        prices: Optional[dict] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.prices = prices
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        # max_retries=0: retries belong to optagent.retries alone, or they would multiply.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or _NO_KEY, timeout=timeout_s, max_retries=0
        )

    def check(self, timeout_s: float = 10.0) -> None:
        """Raise LLMUnreachable unless the endpoint answers GET {base_url}/models; once, without retries.

        A server without the listing (404, 405, ...) still answered, so it counts as reachable;
        a refused connection, a DNS failure, a timeout, a refused key and a 5xx do not.
        """
        url = f"{self.base_url.rstrip('/')}/models"
        try:
            self._client.with_options(timeout=timeout_s, max_retries=0).models.list()
        except openai.APITimeoutError:
            raise LLMUnreachable(f"{url}: the LLM endpoint did not answer within {timeout_s:g} s") from None
        except openai.APIConnectionError as exc:
            raise LLMUnreachable(f"{url}: cannot reach the LLM endpoint: {_root_cause(exc)}") from None
        except openai.APIStatusError as exc:
            if exc.status_code in _REFUSED or exc.status_code >= 500:
                message = " ".join(str(exc.message).split())[:200]
                raise LLMUnreachable(f"{url}: the LLM endpoint answered HTTP {exc.status_code}: {message}") from None
        except Exception:  # a 200 whose body is not a model list: a server answered all the same
            pass

    @llm_retry
    def _create(self, messages: list[dict]) -> object:
        kwargs: dict = {"model": self.model, "messages": messages}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        try:
            return self._client.chat.completions.create(**kwargs)
        except openai.APIResponseValidationError as exc:
            raise LLMError(f"{self.base_url}: reply does not match the chat-completions schema: {exc}") from exc
        except ValueError as exc:  # a 200 whose body is not JSON (a proxy's HTML page, say)
            raise LLMError(f"{self.base_url}: reply body is not JSON: {exc}") from exc

    def complete(self, messages: list[dict]) -> LLMReply:
        response = self._create(messages)
        # A text/plain 200 comes back as a str, a JSON list as a list: neither has choices.
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list):
            raise LLMError(f"{self.base_url}: reply is not a chat completion: {str(response)[:200]!r}")
        if not choices:
            raise LLMError(f"{self.base_url}: reply has no choices")
        message = getattr(choices[0], "message", None)
        text = getattr(message, "content", None)
        # Reasoning models (DeepSeek-R1, vLLM's reasoning parsers, ...) send their thinking in a field
        # of its own, or as <think> blocks before the answer: either way it is not the answer.
        reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
        reasoning = reasoning if isinstance(reasoning, str) else ""
        if isinstance(text, str):
            text, thought = split_reasoning(text)
            reasoning = "\n".join(r for r in (reasoning, thought) if r)
        if not isinstance(text, str) or (reasoning and not text.strip()):
            reason = getattr(choices[0], "finish_reason", None)
            what = "only reasoning, no answer" if reasoning else "no message content"
            hint = " (raise --max-tokens)" if reason == "length" else ""
            raise LLMError(f"{self.base_url}: reply has {what} (finish_reason={reason}){hint}")
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        return LLMReply(
            text=text,
            reasoning=reasoning,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost_usd(self.prices, prompt_tokens, completion_tokens),
                requests=1,
            ),
        )
