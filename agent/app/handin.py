"""What an outside agent hands in, read the way the prompt asks for it.

A hand-in is one of: an ``IDEA:`` line and SEARCH/REPLACE blocks against its parent's kernel,
an ``IDEA:`` line and the whole file in a fenced code block, or the raw source (an ``IDEA:``
line above it is taken as the idea, not as code). The reading is the LLM planner's own
(llm/replies.py, llm/edits.py); a block that does not apply is an error naming it, with the
parent's nearest lines, before anything is evaluated or recorded.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import BaseModel

from optagent.integrity import python_syntax_error
from optagent.llm.edits import EditError, apply_edits
from optagent.llm.replies import (IDEA_MAX_CHARS, NoKernelError, has_fence, idea_line, parse_edits, parse_reply,
                                  without_idea_lines)
from optagent.schema import Language


class HandInError(ValueError):
    """A hand-in that cannot be read; the message names it and what is wrong."""


class ReadAs(str, Enum):
    EDITS = "edits"  # SEARCH/REPLACE blocks applied to the parent's kernel
    FENCED = "fenced"  # the whole file in a fenced code block
    RAW = "raw"  # the file is the source itself


class HandIn(BaseModel):
    label: str  # the file name, or "source N"
    source: str
    idea: str  # '' when none was given
    parent: Optional[int]  # None: the starter's source (no kernel has passed)
    read_as: ReadAs
    blocks: int = 0

    def describe(self) -> str:
        base = f"step {self.parent}'s kernel" if self.parent is not None else "the starter"
        what = {ReadAs.EDITS: f"{self.blocks} SEARCH/REPLACE block{'s' if self.blocks != 1 else ''} applied to {base}",
                ReadAs.FENCED: f"the whole file in a fenced code block (parent: {base})",
                ReadAs.RAW: f"raw source (parent: {base})"}[self.read_as]
        idea = f"; IDEA: {self.idea}" if self.idea else "; no IDEA: line"
        if self.idea.endswith("…"):  # llm/replies.py clips an idea to IDEA_MAX_CHARS: the tables show it so
            idea += f" (cut to {IDEA_MAX_CHARS} characters: say it shorter)"
        return f"{self.label}: read as {what}{idea}"


def read_handin(label: str, text: str, parent: Optional[int], parent_source: str, language: Language) -> HandIn:
    """The kernel a hand-in describes, and how it was read; raises HandInError."""
    if not text.strip():
        raise HandInError(f"{label}: empty; hand in the IDEA: line and SEARCH/REPLACE blocks, or a whole file")
    idea = idea_line(text)
    try:
        edits = parse_edits(text)
    except NoKernelError as e:
        raise HandInError(f"{label}: {e}") from None
    if edits:
        try:
            source = apply_edits(parent_source, edits)
        except EditError as e:
            on = f"step {parent}'s kernel" if parent is not None else "the starter"
            raise HandInError(f"{label}: does not apply to {on} (nothing was evaluated): {e}") from None
        if source.strip() == parent_source.strip():
            raise HandInError(f"{label}: its SEARCH/REPLACE blocks leave the parent's kernel unchanged")
        return HandIn(label=label, source=source, idea=idea, parent=parent, read_as=ReadAs.EDITS,
                      blocks=len(edits))
    body = without_idea_lines(text)
    python = language is not Language.CUDA
    if has_fence(body) and not (python and python_syntax_error(body) is None):
        try:
            parsed = parse_reply(text, language)
        except NoKernelError as e:
            raise HandInError(f"{label}: {e}") from None
        assert parsed.source is not None  # parse_reply found no edits above
        return HandIn(label=label, source=parsed.source, idea=idea, parent=parent, read_as=ReadAs.FENCED)
    return HandIn(label=label, source=body if body.endswith("\n") else body + "\n", idea=idea, parent=parent,
                  read_as=ReadAs.RAW)


def default_parent(store) -> Optional[int]:
    """The kernel the feedback names as the one to improve: the next planner context's parent
    (on a GPU the run's best, on the CPU the newest passing kernel; None while none passed)."""
    from optagent.search.rounds import round_parents
    from optagent.runs.trajectory import Trajectory

    return round_parents(Trajectory.load(store), store.config, 1)[0]


def _fits_elsewhere(text: str, steps: set[int], traj) -> list[int]:
    """The passing steps (newest last) whose kernel a hand-in's SEARCH/REPLACE blocks apply to: the blocks were
    likely written against one of them, and the hint saves a probe."""
    try:
        edits = parse_edits(text)
    except NoKernelError:
        return []
    fits = []
    for step in sorted(steps):
        source = traj.sources.get(step)
        if not edits or source is None:
            continue
        try:
            if apply_edits(source, edits).strip() != source.strip():
                fits.append(step)
        except EditError:
            continue
    return fits


def read_round(store, texts: list[str], ideas: Optional[list[str]], parents: list[Optional[int]],
               labels: list[str]) -> list[HandIn]:
    """Every hand-in of a round read against its own parent (None: the feedback's). One that cannot be read
    refuses the whole round: HandInError names every such file, and says the others read well but were not
    evaluated either."""
    from optagent.runs.trajectory import Trajectory

    traj = Trajectory.load(store)
    passing = {s.index for s in traj.steps if s.result is not None and s.result.status.ok}
    fallback = default_parent(store)
    out: list[HandIn] = []
    errors: list[str] = []
    for i, (text, label) in enumerate(zip(texts, labels)):
        parent = parents[i] if parents[i] is not None else fallback
        if parents[i] is not None and parent not in passing:
            errors.append(f"{label}: parent {parent} is not a passing step of run {store.config.run_id} "
                          f"(passing: {', '.join(map(str, sorted(passing))) or 'none'})")
            continue
        base = traj.starter if parent is None else (traj.sources.get(parent) or traj.starter)
        try:
            got = read_handin(label, text, parent, base, store.config.language)
        except HandInError as e:
            fits = [] if parents[i] is not None else _fits_elsewhere(text, passing - {parent}, traj)
            hint = f"\n  Its blocks apply to step {fits[-1]}'s kernel: hand it in as {label}@{fits[-1]}" if fits else ""
            errors.append(f"{e}{hint}")
            continue
        given = (ideas[i] if ideas else "").strip()
        out.append(got.model_copy(update={"idea": given or got.idea}))
    if errors:
        fine = [f"{h.label}: read well, not evaluated either (the round was refused)" for h in out]
        raise HandInError("\n".join(errors + fine))
    return out
