"""Replays recorded LLM replies: runs the loop offline, reproducibly, with no endpoint.

Each reply is parsed and applied exactly as the LLM planner does it (the same
``proposal_from_reply``), so a recorded session exercises the real edit path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from optagent.protocols import PlannerExhausted
from optagent.runs.view import PlannerContext
from optagent.schema import PlannerKind, Proposal
from optagent.search.planners.llm import proposal_from_reply


def load_replies(path: Union[str, Path]) -> list[dict]:
    """Entries {"reply": str, "idea": optional str} from a JSON list or a JSONL file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the replies: {getattr(exc, 'strerror', None) or exc}") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            raw = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON list: {exc}") from exc
    else:
        raw = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from exc
    entries = []
    for k, item in enumerate(raw, 1):
        if isinstance(item, str):  # a bare list of reply strings is accepted too
            item = {"reply": item}
        if not isinstance(item, dict) or not isinstance(item.get("reply"), str):
            raise ValueError(f"{path}: entry {k} has no string 'reply'")
        entries.append(item)
    return entries


class ReplayPlanner:
    name = PlannerKind.REPLAY
    model: Optional[str] = None

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._entries = load_replies(self.path)
        self._next = 0

    def propose(self, ctx: PlannerContext) -> Proposal:
        # One reply per recorded step after the starter: a resumed run continues where it stopped.
        self._next = max(self._next, sum(1 for a in ctx.attempts if a.index > 0))
        if self._next >= len(self._entries):
            raise PlannerExhausted(f"all {len(self._entries)} recorded replies in {self.path} replayed")
        entry = self._entries[self._next]
        self._next += 1
        proposal, _ = proposal_from_reply(entry["reply"], ctx, idea=entry.get("idea"))
        proposal.meta["replay_index"] = self._next
        return proposal
