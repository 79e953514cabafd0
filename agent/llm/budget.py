"""What the prompt keeps of past attempts, so that a round of failed full rewrites does not fill it.

- A failed attempt's change is shown as a diff against its own parent only when it is small
  (SMALL_DIFF changed lines); a larger one is "a rewrite, N lines changed": a 130-line diff of a whole
  new file teaches less than its error does, and costs thousands of tokens.
- A failure identical to an earlier one shown (same status, same message up to its numbers) is
  one line naming that one.
- A long module docstring of the kernel to improve is folded to its first line: the code says the same,
  and a SEARCH part never needs it (blocks apply to the real file, docstring and all).
- A failure is dropped from the details once a later attempt on the same line of work (made from its
  parent, or from a kernel derived from it) passed with much the same code (SIMILAR): it was fixed,
  its error is history. The ledger still lists it.
"""

from __future__ import annotations

import ast
import difflib
import re
from typing import Any, Optional

from optagent.text import parse
from optagent.runs.view import Attempt

SMALL_DIFF = 40  # changed lines (+ and -) that are still shown as a diff
SIMILAR = 0.7  # share of lines in common that makes a later passing kernel a fix of a failed one
DIFF_CONTEXT = 2
DOCSTRING_LINES = 6  # a module docstring longer than this is folded in the kernel shown
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.IGNORECASE)


def change(parent: Optional[str], child: Optional[str]) -> dict[str, str]:
    """{"diff": a unified diff when small, "rewritten": a one-line size note when not}; both '' when
    either side is missing or they agree."""
    if not parent or not child or parent == child:
        return {"diff": "", "rewritten": ""}
    lines = list(difflib.unified_diff(parent.splitlines(), child.splitlines(), "parent", "candidate",
                                      n=DIFF_CONTEXT, lineterm=""))
    changed = sum(1 for ln in lines if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
    if changed > SMALL_DIFF:
        return {"diff": "", "rewritten": f"a rewrite, {changed} lines changed ({len(parent.splitlines())} -> "
                                         f"{len(child.splitlines())} lines; no diff shown)"}
    return {"diff": "\n".join(lines), "rewritten": ""}


def fold_docstring(source: str) -> str:
    """A Python kernel with a long module docstring folded to its first line (the rest named, not shown);
    anything else unchanged."""
    try:
        body = parse(source).body
    except (SyntaxError, ValueError):
        return source
    first = body[0] if body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
            and first.end_lineno is not None and first.end_lineno - first.lineno + 1 > DOCSTRING_LINES):
        return source
    lines = source.splitlines(keepends=True)
    head = first.value.value.strip().splitlines()[0].strip().replace('"', "'")
    cut = first.end_lineno - first.lineno
    folded = f'"""{head} (the rest of this docstring, {cut} lines, is not shown)"""\n'
    return "".join(lines[:first.lineno - 1] + [folded] + lines[first.end_lineno:])


def failed(a: Attempt) -> bool:
    return a.result is not None and not a.result.status.ok


def failure_key(a: Attempt) -> Optional[str]:
    """What makes two failures the same: the status and the first failing message, numbers aside."""
    if not failed(a):
        return None
    r = a.result
    bad = next((c for c in r.cases if not c.status.ok and c.reason), None)
    text = (bad.reason if bad else None) or r.reason or a.error or ""
    return f"{r.status.value}|{_NUMBER.sub('#', text.strip().split(chr(10))[0])}"


def _ancestors(index: int, parent_of: dict[int, Optional[int]]) -> set[int]:
    out: set[int] = set()
    at = parent_of.get(index)
    while at is not None and at not in out:
        out.add(at)
        at = parent_of.get(at)
    return out


def _similar(a: Optional[str], b: Optional[str]) -> bool:
    return bool(a and b) and difflib.SequenceMatcher(None, a.splitlines(), b.splitlines()).ratio() >= SIMILAR


def superseded(a: Attempt, attempts: list[Attempt]) -> bool:
    """A failure fixed later: a passing attempt of a later round (one of the same round was written beside it,
    not as its fix), made from its parent or from a kernel derived from it, with much the same code."""
    if not failed(a) or not a.source:
        return False
    parent_of = {x.index: (x.parent if x.parent is not None or x.index == 0 else 0) for x in attempts}
    root = parent_of.get(a.index, 0)
    def later(x: Attempt) -> bool:
        return x.index > a.index and (x.round is None or a.round is None or x.round > a.round)

    return any(later(x) and x.result is not None and x.result.status.ok
               and root in _ancestors(x.index, parent_of) and _similar(a.source, x.source) for x in attempts)


def detailed(tried: list[Attempt], attempts: list[Attempt], recent: int) -> list[tuple[Attempt, Optional[int]]]:
    """The last ``recent`` attempts worth detailing, each with the earlier shown step whose failure it repeats."""
    kept = [a for a in tried if not superseded(a, attempts)][-recent:]
    first: dict[str, int] = {}
    out: list[tuple[Attempt, Optional[int]]] = []
    for a in kept:
        key = failure_key(a)
        same = first.get(key) if key else None
        if key and same is None:
            first[key] = a.index
        out.append((a, same))
    return out


def parent_source(a: Attempt, attempts: list[Attempt], starter: str) -> Optional[str]:
    """The kernel attempt ``a`` was made from: its recorded parent; with none recorded (an old run), the
    starter's step, else the starter's text."""
    by_index = {x.index: x for x in attempts}
    parent = by_index.get(a.parent if a.parent is not None else 0)
    return parent.source if parent is not None and parent.source else starter


def summary_line(a: Attempt) -> dict[str, Any]:
    """One line for a repeated failure."""
    r = a.result
    reason = (r.reason or a.error or "").strip().split("\n")[0] if r else (a.error or "")
    return {"status": r.status.value if r else a.outcome, "reason": reason[:200]}
