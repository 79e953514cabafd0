"""Turning an LLM reply into a kernel: aider-style SEARCH/REPLACE edits, or one whole file.

Edits match whole lines. A SEARCH text must match exactly one place; when it
matches nowhere, a whitespace-insensitive match is accepted only if it is
unique, because a guessed location would silently corrupt the kernel. Errors
name the failing block and show the nearest lines of the current source, so
the next prompt can show the model what it should have copied.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Optional, Union

from .schema import Language

IDEA_MAX_CHARS = 120
_SHOW_MAX_LINES = 30  # cap on quoted SEARCH text and nearest-lines windows in messages
_CONTEXT_LINES = 2  # lines shown either side of the nearest window

_START = re.compile(r"^\s*<{5,9}\s*SEARCH\b.*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_END = re.compile(r"^\s*>{5,9}\s*REPLACE\b.*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)")
_IDEA = re.compile(r"^[\s>*_#-]*IDEA\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)

# Fence tags accepted for a whole file; a bare fence is accepted for every language.
_TAGS: dict[Language, set[str]] = {
    Language.TRITON: {"python", "py", "python3", "triton"},
    Language.TILELANG: {"python", "py", "python3", "tilelang"},
    Language.CUDA: {"cuda", "cu", "cpp", "c++", "cxx", "cc", "c"},
}


class EditError(Exception):
    """A SEARCH/REPLACE block does not apply to the current source."""

    def __init__(self, message: str, block: Optional[int] = None) -> None:
        super().__init__(message)
        self.block = block


class NoKernelError(Exception):
    """The reply holds neither usable edits nor a whole kernel file."""


@dataclass(frozen=True)
class Edit:
    search: str  # lines joined by "\n", without a final newline
    replace: str
    index: int  # 1-based position of the block in the reply


@dataclass(frozen=True)
class ParsedReply:
    """Exactly one of ``edits`` (non-empty) and ``source`` is set."""

    edits: tuple[Edit, ...] = ()
    source: Optional[str] = None

    @property
    def kind(self) -> str:
        return "edits" if self.edits else "file"


# ---------------------------------------------------------------- parsing


def parse_edits(reply: str) -> list[Edit]:
    """The SEARCH/REPLACE blocks of a reply, in order; fences around them are ignored."""
    edits: list[Edit] = []
    search: list[str] = []
    replace: list[str] = []
    state = "out"
    for line in reply.replace("\r\n", "\n").split("\n"):
        if state == "out":
            if _START.match(line):
                state, search, replace = "search", [], []
        elif state == "search":
            if _DIVIDER.match(line):
                state = "replace"
            elif _START.match(line) or _END.match(line):
                raise NoKernelError(f"SEARCH/REPLACE block {len(edits) + 1} is malformed: "
                                    "a marker appears before its ======= divider")
            else:
                search.append(line)
        else:
            if _END.match(line):
                edits.append(Edit("\n".join(search), "\n".join(replace), len(edits) + 1))
                state = "out"
            elif _START.match(line):
                raise NoKernelError(f"SEARCH/REPLACE block {len(edits) + 1} has no "
                                    ">>>>>>> REPLACE line before the next block")
            else:
                replace.append(line)
    if state != "out":
        raise NoKernelError(f"SEARCH/REPLACE block {len(edits) + 1} is not closed "
                            "(the reply may have been cut off)")
    return edits


@dataclass
class _Fence:
    tag: str
    body: str
    closed: bool


def _fences(reply: str) -> list[_Fence]:
    blocks: list[_Fence] = []
    lines = reply.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        marker, tag = m.group(1), m.group(2).lower()
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            # A closing fence uses the same character, at least as many, and no info string.
            if stripped and set(stripped) == {marker[0]} and len(stripped) >= len(marker):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        blocks.append(_Fence(tag, "\n".join(body), closed))
    return blocks


def parse_reply(reply: str, language: Union[Language, str, None] = None) -> ParsedReply:
    """Edits if the reply has SEARCH/REPLACE blocks, else the longest fenced file defining run_kernel."""
    if not reply or not reply.strip():
        raise NoKernelError("the reply is empty")
    edits = parse_edits(reply)
    if edits:
        return ParsedReply(edits=tuple(edits))
    lang = Language(language) if language is not None else None
    accepted = _TAGS[lang] if lang else set().union(*_TAGS.values())
    fences = _fences(reply)
    if not fences:
        raise NoKernelError("the reply has neither SEARCH/REPLACE blocks nor a fenced code block")
    defining = [f for f in fences if "run_kernel" in f.body]
    usable = [f for f in defining if f.closed and (f.tag == "" or f.tag in accepted)]
    if usable:
        # The longest block: models often show a short usage snippet next to the real file.
        body = max(usable, key=lambda f: len(f.body)).body
        return ParsedReply(source=body.rstrip("\n") + "\n")
    if any(not f.closed for f in fences):
        raise NoKernelError("a fenced code block is not closed (the reply may have been cut off)")
    if defining:
        tags = ", ".join(sorted({f"```{f.tag}" for f in defining}))
        raise NoKernelError(f"the code block defining run_kernel is tagged {tags}, "
                            f"which is not a {lang.value if lang else 'kernel'} file")
    raise NoKernelError(f"none of the reply's {len(fences)} code block(s) defines run_kernel")


# ---------------------------------------------------------------- applying


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
    lines = text.split("\n")
    shown = lines[:_SHOW_MAX_LINES]
    more = f"\n    ... ({len(lines) - len(shown)} more lines)" if len(lines) > len(shown) else ""
    return "\n".join("    " + line for line in shown) + more


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


# ---------------------------------------------------------------- ideas


def _clip(text: str) -> str:
    text = text.strip().strip("*_`").strip()
    return text if len(text) <= IDEA_MAX_CHARS else text[: IDEA_MAX_CHARS - 1].rstrip() + "…"


def extract_idea(reply: str) -> str:
    """The reply's ``IDEA:`` line, else the first sentence of its prose; '' when it has none."""
    m = _IDEA.search(reply or "")
    if m and m.group(1).strip("*_` "):
        return _clip(m.group(1))
    in_fence = in_block = False
    for line in (reply or "").replace("\r\n", "\n").split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if _START.match(line):
            in_block = True
        if in_block:
            in_block = not _END.match(line)
            continue
        if in_fence or not line.strip():
            continue
        prose = line.strip().lstrip("#>*-_ ").strip()
        if prose:
            return _clip(re.split(r"(?<=[.!?])\s", prose, maxsplit=1)[0])
    return ""
