"""Renders the prompt templates in ``prompts/``; no prompt text lives in Python."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2


def prompts_dir() -> Path:
    """The template folder: the repo-root ``prompts/``, or OPTAGENT_PROMPTS_DIR to try variants."""
    override = os.environ.get("OPTAGENT_PROMPTS_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return Path(__file__).resolve().parent.parent / "prompts"


@lru_cache(maxsize=8)
def _environment(folder: Path) -> jinja2.Environment:
    # StrictUndefined: a misspelt variable must fail loudly, not silently drop a prompt section.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["indent_block"] = _indent_block
    return env


def _indent_block(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line.strip() else line for line in str(text).splitlines())


def render(name: str, **variables: Any) -> str:
    """Render ``prompts/<name>.j2`` with ``variables``."""
    folder = prompts_dir()
    if not (folder / f"{name}.j2").is_file():
        raise FileNotFoundError(f"no prompt template {name}.j2 in {folder}")
    return _environment(folder).get_template(f"{name}.j2").render(**variables)
