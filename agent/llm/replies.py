"""Reading an LLM reply: its SEARCH/REPLACE blocks or its one whole kernel file, and its idea.

Parsing only; applying edits to a kernel is `edits`. A reply that holds neither usable
edits nor a whole file raises NoKernelError with what is wrong, for the next prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from optagent.schema import Language

IDEA_MAX_CHARS = 120
_START = re.compile(r"^\s*<{5,9}\s*SEARCH\b.*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_END = re.compile(r"^\s*>{5,9}\s*REPLACE\b.*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)")
_IDEA = re.compile(r"^[\s>*_#-]*IDEA\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)

# Fence tags accepted for a whole file besides the language's own (Language.fence, what the
# prompt asks for); a bare fence is accepted for every language.
_TAGS: dict[Language, set[str]] = {lang: {lang.fence, *more} for lang, more in {
    Language.TRITON: {"py", "python3", "triton"},
    Language.TILELANG: {"py", "python3", "tilelang"},
    Language.CUDA: {"cu", "cpp", "c++", "cxx", "cc", "c"},
}.items()}


_THINK = re.compile(r"^\s*<(think|thinking|reasoning)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning) of a reply whose reasoning model put ``<think>...</think>`` blocks before the
    answer; an unclosed block (the reply was cut off while thinking) is all reasoning."""
    reasoning: list[str] = []
    while True:
        m = _THINK.match(text)
        if not m:
            return text.lstrip("\n"), "\n".join(reasoning)
        reasoning.append(m.group(2).strip())
        text = text[m.end():]


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


# ---------------------------------------------------------------- ideas


def _clip(text: str) -> str:
    text = text.strip().strip("*_`").strip()
    return text if len(text) <= IDEA_MAX_CHARS else text[: IDEA_MAX_CHARS - 1].rstrip() + "…"


def idea_line(reply: str) -> str:
    """The reply's ``IDEA:`` line only (no prose fallback: a raw source's first line is no idea); ''."""
    m = _IDEA.search(reply or "")
    return _clip(m.group(1)) if m and m.group(1).strip("*_` ") else ""


def without_idea_lines(text: str) -> str:
    """``text`` without the ``IDEA:`` lines before its first other non-blank line (a raw source under one)."""
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines) and (not lines[i].strip() or _IDEA.match(lines[i])):
        i += 1
    return "\n".join(lines[i:]) if any(_IDEA.match(x) for x in lines[:i]) else text


def has_fence(text: str) -> bool:
    return any(_FENCE.match(line) for line in text.split("\n"))


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
