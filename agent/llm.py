"""An OpenAI-compatible chat-completions client implementing the LLM protocol."""

from __future__ import annotations

from typing import Optional

import openai

from .protocols import LLMReply
from .retry import llm_retry
from .llm_config import LLMSettings, llm_settings_from_env  # noqa: F401 (re-exported)
from .schema import Usage

# Some local servers (vLLM, llama.cpp) ignore the key, but the client insists on one.
_NO_KEY = "no-key"


class LLMError(Exception):
    """The server answered, but not with a usable chat completion."""


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
        timeout_s: float = 120,
        prices: Optional[dict] = None,
        max_tokens: Optional[int] = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.prices = prices
        self.max_tokens = max_tokens
        # max_retries=0: retries belong to optagent.retry alone, or they would multiply.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or _NO_KEY, timeout=timeout_s, max_retries=0
        )

    @llm_retry
    def _create(self, messages: list[dict]) -> object:
        kwargs: dict = {"model": self.model, "messages": messages}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
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
        if not isinstance(text, str):
            reason = getattr(choices[0], "finish_reason", None)
            raise LLMError(f"{self.base_url}: reply has no message content (finish_reason={reason})")
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        return LLMReply(
            text=text,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost_usd(self.prices, prompt_tokens, completion_tokens),
            ),
        )
