"""List prices of known models, USD per million tokens (prompt, completion), as their makers publish them.

Only a default for the cost column and --budget-usd: OPTAGENT_PRICE_PROMPT / OPTAGENT_PRICE_COMPLETION
override it (llm/config.py), and a model not in the table is unpriced unless they are set. A name
matches an entry when it equals it or starts with it followed by '-' or '@' (dated snapshots such as
gpt-4o-2024-08-06), after any provider prefix ("openai/gpt-4o"); the longest entry wins.
"""

from __future__ import annotations

from typing import Optional

PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "deepseek-chat": (0.27, 1.10),
    "deepseek-reasoner": (0.55, 2.19),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "gemini-2.5-pro": (1.25, 10.00),
    "gemini-2.5-flash": (0.30, 2.50),
}


def known_prices(model: str) -> Optional[dict]:
    """{"prompt_per_mtok", "completion_per_mtok"} of the table's entry for ``model``, or None."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    hits = [key for key in PRICES if name == key or name.startswith((key + "-", key + "@"))]
    if not hits:
        return None
    prompt, completion = PRICES[max(hits, key=len)]
    return {"prompt_per_mtok": prompt, "completion_per_mtok": completion}
