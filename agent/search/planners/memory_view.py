"""What the LLM planner is told of earlier runs (PlannerContext.memory): a bounded summary for prompts/memory.j2.

The ledger grows with every run; the prompt must not. At most MAX_ROWS rows whatever its size: the
best kernel kept on each bench (this run's first, at most MAX_BENCHES), the ideas that worked best
(each idea once, this run's bench first, fastest first), and at most MAX_FAILURES failures: one of
each kind first (a compile error, a wrong result and a timeout each teach something different),
then the newest. Every text is cut to a length, so the block's size is bounded too.
"""

from __future__ import annotations

from typing import Any, Optional

from optagent.schema import Status
from optagent.runs.ledger import LedgerEntry
from optagent.runs.memory import Recall, describe_bench

MAX_BENCHES = 3
MAX_ROWS = 12
MAX_FAILURES = 5
IDEA_CHARS = 120
REASON_CHARS = 160


def _cut(text: Optional[str], limit: int) -> str:
    text = " ".join((text or "").split()).replace("|", "/")  # one table cell
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _row(e: LedgerEntry) -> dict[str, Any]:
    return {"run": e.run_id, "step": e.step, "bench": describe_bench(e.bench), "idea": _cut(e.idea, IDEA_CHARS),
            "outcome": e.outcome.value, "status": e.status.value if e.status else "-",
            "speedup": f"{e.speedup:.3f}" if e.speedup else "-", "gain": f"{e.gain:+.1%}" if e.gain is not None else "",
            "reason": _cut(e.reason, REASON_CHARS) or "-"}


def _worked(recall: Recall) -> list[LedgerEntry]:
    best: dict[str, LedgerEntry] = {}
    for e in recall.entries:
        if e.status is Status.PASSED and e.speedup and (e.idea not in best or e.speedup > best[e.idea].speedup):
            best[e.idea] = e
    return sorted(best.values(), key=lambda e: (e.bench != recall.bench, -e.speedup))


def _failures(recall: Recall) -> list[LedgerEntry]:
    newest: dict[str, LedgerEntry] = {}
    for e in reversed(recall.entries):
        if e.status is not None and e.status is not Status.PASSED and e.idea not in newest:
            newest[e.idea] = e
    order = list(newest.values())
    kinds: dict[Status, LedgerEntry] = {}
    for e in order:
        kinds.setdefault(e.status, e)
    firsts = list(kinds.values())
    return (firsts + [e for e in order if e not in firsts])[:MAX_FAILURES]


def memory_view(recall: Optional[Recall]) -> Optional[dict[str, Any]]:
    if recall is None or not recall.entries:
        return None
    benches = sorted(recall.best_per_bench.items(), key=lambda kv: (kv[0] != recall.bench, -kv[1].speedup))
    failures = _failures(recall)
    worked = _worked(recall)[:MAX_ROWS - len(failures)]
    rows = [_row(e) for e in worked + failures]
    return {"runs": recall.runs, "entries": len(recall.entries), "shown": len(rows),
            "best": [_row(e) for _, e in benches[:MAX_BENCHES]], "rows": rows}
