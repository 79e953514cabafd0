"""Applying aider-style SEARCH/REPLACE edits to a kernel (a reply is read by `replies`).

Edits match whole lines. A SEARCH text must match exactly one place; when it
matches nowhere, a whitespace-insensitive match is accepted only if it is
unique, because a guessed location would silently corrupt the kernel. Errors
name the failing block and show the nearest lines of the current source, so
the next prompt can show the model what it should have copied.
"""

from __future__ import annotations

import difflib
from typing import Optional, Union

from optagent.llm.replies import Edit, NoKernelError, ParsedReply, parse_reply
from optagent.schema import Language

_SHOW_MAX_LINES = 30  # cap on quoted SEARCH text and nearest-lines windows in messages
_CONTEXT_LINES = 2  # lines shown either side of the nearest window


class EditError(Exception):
    """A SEARCH/REPLACE block does not apply to the current source."""

    def __init__(self, message: str, block: Optional[int] = None) -> None:
        super().__init__(message)
        self.block = block


def _norm(line: str) -> str:
    return " ".join(line.split())


def _numbered(lines: list[str], start: int, first: int, last: int) -> str:
    """Lines[start:...] with 1-based numbers; lines first..last (0-based, inclusive) marked '>'."""
    width = len(str(start + len(lines)))
    out = []
    for k, line in enumerate(lines):
        i = start + k
        mark = ">" if first <= i <= last else " "
        out.append(f"{mark}{i + 1:>{width}} | {line}")
    return "\n".join(out)


def nearest_lines(source: str, search: str) -> str:
    """The window of ``source`` most similar to ``search``, numbered, with a little context."""
    lines = source.split("\n")
    wanted = search.split("\n")
    n = max(1, min(len(wanted), len(lines)))
    target = "\n".join(wanted)
    starts = range(max(1, len(lines) - n + 1))
    # quick_ratio is an upper bound of ratio and cheap; score only the promising windows exactly.
    rough = sorted(starts, key=lambda i: difflib.SequenceMatcher(
        None, target, "\n".join(lines[i:i + n])).quick_ratio(), reverse=True)[:20]
    best, score = 0, -1.0
    for i in rough:
        r = difflib.SequenceMatcher(None, target, "\n".join(lines[i:i + n])).ratio()
        if r > score:
            best, score = i, r
    last = min(best + n, len(lines)) - 1
    last = min(last, best + _SHOW_MAX_LINES - 1)
    lo, hi = max(0, best - _CONTEXT_LINES), min(len(lines), last + 1 + _CONTEXT_LINES)
    span = f"line {best + 1}" if last == best else f"lines {best + 1}-{last + 1}"
    head = f"Nearest lines of the current kernel ({span}, {score:.0%} similar):"
    return head + "\n" + _numbered(lines[lo:hi], lo, best, last)


def _quote(text: str) -> str:
    """SEARCH text as quoted in an error: behind a "| " margin, so that its own indentation reads as it is (an
    indent of four spaces read as part of the line: a model counted 25 spaces where it wrote 21)."""
    lines = text.split("\n")
    shown = lines[:_SHOW_MAX_LINES]
    more = f"\n  ... ({len(lines) - len(shown)} more lines)" if len(lines) > len(shown) else ""
    return "\n".join("  | " + line for line in shown) + more


def _trim_blank_edges(search: list[str], replace: list[str]) -> tuple[list[str], list[str]]:
    """Drop blank lines at the edges of SEARCH (and as many from REPLACE) for the fuzzy match."""
    while search and not search[0].strip():
        search = search[1:]
        if replace and not replace[0].strip():
            replace = replace[1:]
    while search and not search[-1].strip():
        search = search[:-1]
        if replace and not replace[-1].strip():
            replace = replace[:-1]
    return search, replace


def _reindent(replace: list[str], search_first: str, source_first: str) -> list[str]:
    """Shift REPLACE by the indentation the fuzzy match found between SEARCH and the source."""
    want = source_first[: len(source_first) - len(source_first.lstrip())]
    have = search_first[: len(search_first) - len(search_first.lstrip())]
    if want == have:
        return replace
    if want.startswith(have):
        extra = want[len(have):]
        return [extra + r if r.strip() else r for r in replace]
    if have.startswith(want):
        cut = have[len(want):]
        return [r[len(cut):] if r.startswith(cut) else r for r in replace]
    return replace


def _apply_one(text: str, edit: Edit, total: int) -> str:
    label = f"SEARCH/REPLACE block {edit.index} of {total}"
    after = ("" if edit.index == 1 else " (after block 1 was applied)" if edit.index == 2
             else f" (after blocks 1-{edit.index - 1} were applied)")
    if not edit.search.strip():
        raise EditError(f"{label}: the SEARCH section is empty; it must quote lines of the "
                        "current kernel", edit.index)
    lines = text.split("\n")
    search, replace = edit.search.split("\n"), edit.replace.split("\n")
    n = len(search)
    exact = [i for i in range(len(lines) - n + 1) if lines[i:i + n] == search]
    if len(exact) == 1:
        i = exact[0]
        return "\n".join(lines[:i] + replace + lines[i + n:])
    if len(exact) > 1:
        where = ", ".join(str(i + 1) for i in exact)
        raise EditError(f"{label}: the SEARCH text matches {len(exact)} places in the current "
                        f"kernel{after} (starting at lines {where}); it must match exactly one.\n"
                        f"SEARCH text:\n{_quote(edit.search)}", edit.index)
    fsearch, freplace = _trim_blank_edges(search, replace)
    want = [_norm(s) for s in fsearch]
    m = len(want)
    fuzzy = [i for i in range(len(lines) - m + 1) if [_norm(x) for x in lines[i:i + m]] == want] if m else []
    if len(fuzzy) == 1:
        i = fuzzy[0]
        freplace = _reindent(freplace, fsearch[0], lines[i])
        return "\n".join(lines[:i] + freplace + lines[i + m:])
    why = ("was not found" if not fuzzy else
           f"was not found exactly, and ignoring whitespace it matches {len(fuzzy)} places")
    raise EditError(f"{label}: the SEARCH text {why} in the current kernel{after}.\n"
                    f"SEARCH text:\n{_quote(edit.search)}\n"
                    f"{nearest_lines(text, edit.search)}", edit.index)


def apply_edits(source: str, edits: Union[list[Edit], tuple[Edit, ...]]) -> str:
    """Apply the blocks in order; all or nothing (raises EditError on the first that fails)."""
    text = source
    for edit in edits:
        text = _apply_one(text, edit, len(edits))
    return text


def kernel_from_reply(reply: str, current: str, language: Union[Language, str, None] = None
                      ) -> tuple[str, ParsedReply]:
    """The new kernel a reply describes against ``current``; raises EditError / NoKernelError."""
    parsed = parse_reply(reply, language)
    source = apply_edits(current, parsed.edits) if parsed.edits else parsed.source
    assert source is not None
    if source.strip() == current.strip():
        raise NoKernelError("the reply leaves the current kernel unchanged")
    return source, parsed
