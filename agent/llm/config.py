"""Where the LLM endpoint comes from: arguments first, then OPTAGENT_* variables.

Kept apart from ``llm`` so that choosing a planner never imports the openai
client: offline runs need neither it nor a network.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from optagent import secret_env
from optagent.llm.prices import known_prices
from optagent.settings import settings


class LLMSettings(NamedTuple):
    base_url: str
    model: str
    api_key: Optional[str]
    prices: Optional[dict]


def llm_settings_from_env(base_url: Optional[str] = None, model: Optional[str] = None
                          ) -> Optional[LLMSettings]:
    """(base_url, model, api_key, prices) from arguments, then OPTAGENT_* variables; None if unset.

    Prices: the variables where set (one set alone leaves the other at the table's, else 0),
    else the table of known models (llm/prices.py)."""
    env = settings()
    base_url = base_url or env.base_url or None
    model = model or env.model or None
    if not base_url or not model:
        return None
    api_key = secret_env.api_key()
    prompt, completion = env.price_prompt, env.price_completion
    prices = known_prices(model)
    if prompt is not None or completion is not None:
        table = prices or {}
        prices = {"prompt_per_mtok": prompt if prompt is not None else table.get("prompt_per_mtok", 0.0),
                  "completion_per_mtok": completion if completion is not None
                  else table.get("completion_per_mtok", 0.0)}
    return LLMSettings(base_url, model, api_key, prices)
