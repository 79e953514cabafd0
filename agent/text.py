"""Text from anywhere (an error, a reply, a candidate's message) cut down to what a line can show,
and text a candidate wrote (exception text, its log tail, its stdout) made safe to show.

One helper, plain(), for every place that shows a candidate's text: the CLI, `show`, the HTML report,
the MCP tools. Control characters (ESC and the rest of C0 but newline and tab, DEL, C1) are replaced
with a visible mark, so no escape sequence reaches a terminal; and where the text goes into Rich
markup, its brackets are escaped, so that `[bold green]PASSED ...` prints as those characters and
`[/oops]` cannot break the print. The evaluator cleans every string of a verdict once
(evaluation/evaluator.py); the views clean again what they print, for records written before.
"""

from __future__ import annotations

import ast
import threading

import re
from typing import Any, Optional


def first_line(text: Optional[str], limit: Optional[int] = None) -> Optional[str]:
    """The first line that is not blank, stripped and clipped to `limit` characters, its control characters
    replaced; None when there is none."""
    for line in (text or "").splitlines():
        if line.strip():  # shown as plain text: it is often a candidate's
            return plain(line.strip()[:limit] if limit else line.strip(), markup=False)
    return None


REPLACEMENT = "\N{REPLACEMENT CHARACTER}"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: Optional[str], *, markup: bool) -> str:
    """`text` with its control characters replaced; markup=True: for a Rich string read as markup
    (a print with markup on, a table cell), its markup escaped too."""
    out = CONTROL.sub(REPLACEMENT, text or "")
    if not markup:
        return out
    from rich.markup import escape  # here: the worker imports this module, and never needs it

    return escape(out)


def plain_tree(value: Any) -> Any:
    """Every string in a JSON-like tree (a record's model_dump) with its control characters replaced."""
    if isinstance(value, str):
        return plain(value, markup=False)
    if isinstance(value, dict):
        return {k: plain_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_tree(v) for v in value]
    return value


_PARSE = threading.Lock()


def parse(source: str) -> ast.Module:
    """ast.parse, one thread at a time: CPython 3.11 (before 3.11.8) can fail a parse that runs beside another
    in a second thread with "SystemError: AST constructor recursion depth mismatch" (seen in CI, where a
    pool's evaluations check their sources at once)."""
    with _PARSE:
        return ast.parse(source)
