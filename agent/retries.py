"""Every retry optagent makes, on tenacity, in this one module: nothing else retries anything.

LLM calls (``llm_retry``): only transient transport failures are retried: rate limits, timeouts, lost
connections and 5xx answers. A 4xx (bad request, wrong key) or a malformed reply would fail again the same
way, so it surfaces at once. Settings are read when a call starts, so tests (and users) can shrink the waits
through the environment without re-importing anything.

Worker processes (``once_more_if_killed``: the package probe, the judge, an evaluation's candidate process): one
killed from outside (a
signal no limit, timeout or stop of the parent's sent, and that no fault of its own code raises) is the host's
doing or a neighbour's, not the job's: it runs once more, at once. A second such death stands.

A pool's evaluation (``once_more_alone``) whose verdict its company or the host can cause (evaluation/crowd.py) runs
once more with no other evaluation beside it; that verdict stands.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any, Callable, ContextManager, Optional, Protocol, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
)

from optagent.settings import settings

log = logging.getLogger(__name__)



@functools.cache
def llm_retryable() -> tuple[type[BaseException], ...]:
    """The LLM client's transient errors (openai imported only by a run that calls an endpoint)."""
    import openai

    return (
        openai.RateLimitError,
        openai.APITimeoutError,  # a subclass of APIConnectionError, listed for the reader
        openai.APIConnectionError,
        openai.InternalServerError,  # any 5xx
    )


DEFAULT_ATTEMPTS = 5
DEFAULT_BASE_S = 1.0
MAX_WAIT_FACTOR = 60  # no single wait exceeds 60 base waits (one minute by default)

F = TypeVar("F", bound=Callable[..., Any])


def _retry_after_s(exc: Optional[BaseException]) -> Optional[float]:
    """The server's Retry-After (seconds form), when a 429/5xx carries one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        return float(headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None


class _Wait:
    """Exponential backoff with jitter, stretched to the server's Retry-After when it asks for more."""

    # Written out rather than tenacity's wait_exponential_jitter, whose arguments changed across versions.
    def __init__(self, base_s: float) -> None:
        self.base_s = base_s
        self.max_s = base_s * MAX_WAIT_FACTOR

    def __call__(self, state: RetryCallState) -> float:
        exponent = min(state.attempt_number - 1, 30)
        wait = min(self.base_s * 2**exponent + random.uniform(0, self.base_s), self.max_s)
        exc = state.outcome.exception() if state.outcome else None
        asked = _retry_after_s(exc)
        if asked is not None:
            wait = max(wait, min(asked, self.max_s))
        return wait


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.warning("LLM call failed (%s: %s); attempt %d, retrying in %.2fs",
                type(exc).__name__, exc, state.attempt_number, wait)


def llm_retrying(max_attempts: Optional[int] = None, base_s: Optional[float] = None) -> Retrying:
    """A fresh tenacity Retrying; OPTAGENT_RETRY_ATTEMPTS / OPTAGENT_RETRY_BASE_S fill the gaps."""
    env = settings()
    attempts = max_attempts or env.retry_attempts or DEFAULT_ATTEMPTS
    base = base_s if base_s is not None else env.retry_base_s if env.retry_base_s is not None else DEFAULT_BASE_S
    return Retrying(
        retry=retry_if_exception_type(llm_retryable()),
        stop=stop_after_attempt(max(1, attempts)),
        wait=_Wait(max(0.0, base)),
        before_sleep=_log_retry,
        reraise=True,  # the caller sees the last real error, not a tenacity RetryError
    )


def llm_retry(fn: F) -> F:
    """Decorator: call ``fn`` under the policy, with settings read at each call."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return llm_retrying()(fn, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class EndedRun(Protocol):
    """A worker process's run as it ended (evaluation/sandbox.py WorkerRun)."""

    @property
    def killed_from_outside(self) -> bool: ...


R = TypeVar("R", bound=EndedRun)
T = TypeVar("T")


def _log_rerun(state: RetryCallState) -> None:
    log.warning("a worker was killed from outside (attempt %d); running it once more", state.attempt_number)


def once_more_if_killed(run: Callable[[], R]) -> R:
    """run() again once where its process was killed from outside; the last run, whatever it says."""
    return Retrying(stop=stop_after_attempt(2), retry=retry_if_result(lambda r: r.killed_from_outside),
                    before_sleep=_log_rerun, retry_error_callback=lambda state: state.outcome.result())(run)


def once_more_alone(run: Callable[[], T], again: Callable[[T], bool],
                    alone: Callable[[], ContextManager[object]]) -> T:
    """run(); where again(its result), run() once more inside alone(); the last result, whatever it says."""
    calls = [0]

    def attempt() -> T:
        calls[0] += 1
        if calls[0] == 1:
            return run()
        with alone():
            return run()
    return Retrying(stop=stop_after_attempt(2), retry=retry_if_result(again),
                    retry_error_callback=lambda state: state.outcome.result())(attempt)
