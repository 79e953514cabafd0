"""Renders the prompt templates in ``prompts/``; no prompt text lives in Python.

The checkout's top-level ``prompts/`` is installed as the package data
``optagent.prompt_templates`` (pyproject's package-dir), so templates are read
through importlib.resources: found the same way in an editable install and in
a wheel, where no ``prompts/`` folder sits beside the code.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import jinja2

from optagent.settings import settings

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; importlib.abc's alias goes away in 3.14
    from importlib.resources.abc import Traversable

TEMPLATE_PACKAGE = "optagent.prompt_templates"


def prompts_dir() -> Union[Path, Traversable]:
    """The template folder: the installed templates, or OPTAGENT_PROMPTS_DIR to try variants."""
    override = settings().prompts_dir
    if override:
        return Path(override).expanduser().resolve()
    try:
        return resources.files(TEMPLATE_PACKAGE)
    except ModuleNotFoundError:  # an editable install made before prompts/ was package data: the checkout's
        return Path(__file__).resolve().parents[2] / "prompts"


def _source_in(folder: Union[Path, Traversable]):
    def load(name: str) -> Optional[tuple[str, str, Any]]:
        entry = folder.joinpath(name)
        if not entry.is_file():
            return None
        # Read once per environment: templates do not change under a running process.
        return entry.read_text(encoding="utf-8"), str(entry), lambda: True

    return load


@lru_cache(maxsize=8)
def _environment(override: Optional[str]) -> jinja2.Environment:
    """One environment per OPTAGENT_PROMPTS_DIR value (``override`` is the cache key)."""
    folder = prompts_dir()
    # StrictUndefined: a misspelt variable must fail loudly, not silently drop a prompt section.
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_source_in(folder)),
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


def template_names() -> list[str]:
    """Every template's name (without ``.j2``), for checks that all of them render."""
    return sorted(e.name[:-3] for e in prompts_dir().iterdir() if e.name.endswith(".j2"))


def render(name: str, **variables: Any) -> str:
    """Render ``prompts/<name>.j2`` with ``variables``."""
    folder = prompts_dir()
    if not folder.joinpath(f"{name}.j2").is_file():
        raise FileNotFoundError(f"no prompt template {name}.j2 in {folder}")
    return _environment(str(settings().prompts_dir) if settings().prompts_dir else None).get_template(f"{name}.j2").render(**variables)
