"""Memory across runs: a run's link to its task's ledger (ledger.py), and what planners are told of it.

The loop records each committed step (``record``); planners get ``recall()``: what earlier runs on
the task found, and the best kernel they kept on this run's bench (device, device name, language,
cases), its source read back from that run's step files. With ``fresh`` (``optagent run --fresh``)
a run is still recorded, but recalls nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

from optagent.schema import Step
from optagent.runs.ledger import Bench, Ledger, LedgerEntry, incumbent_time, ledger_path, make_entry
from optagent.runs.files import RunError
from optagent.runs.store import RunStore, list_runs



@dataclass
class KnownBest:
    entry: LedgerEntry
    source: str


@dataclass
class Recall:
    """What earlier runs on this task found, as a planner sees it (PlannerContext.memory)."""

    entries: list[LedgerEntry]  # earlier runs' steps, on every bench, in the order recorded
    bench: Bench  # this run's
    best: Optional[KnownBest] = None  # the fastest kernel an earlier run kept on this bench
    best_per_bench: dict[Bench, LedgerEntry] = field(default_factory=dict)

    @property
    def measured(self) -> dict[str, LedgerEntry]:
        """Kernels earlier runs evaluated on this bench, by sha256 (the latest entry of each)."""
        return {e.kernel_sha256: e for e in self.entries if e.evaluated and e.bench == self.bench}

    @property
    def runs(self) -> int:
        return len({e.run_id for e in self.entries})


def best_per_bench(entries: list[LedgerEntry]) -> dict[Bench, list[LedgerEntry]]:
    """Per bench, the kernels runs kept, fastest first (by speedup: its baseline was timed beside it)."""
    out: dict[Bench, list[LedgerEntry]] = {}
    for e in entries:
        if e.outcome.keeps_best and e.speedup and e.evaluated:
            out.setdefault(e.bench, []).append(e)
    return {b: sorted(es, key=lambda e: -e.speedup) for b, es in out.items()}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class RunMemory:
    """One run's side of its task's ledger, which lives beside the run (``<runs dir>/ledger/``)."""

    def __init__(self, store: RunStore, fresh: bool = False):
        cfg = store.config
        self.store, self.fresh, self.run_id = store, fresh, cfg.run_id
        self.root = store.path.parent
        self.ledger = Ledger(ledger_path(self.root, cfg.task_name, cfg.task_digest))
        self._sources: dict[str, Optional[str]] = {}  # read back by sha256, for the known best
        self.backfilled = self.backfill()
        self._mine = dict(self.ledger.by_run().get(self.run_id, {}))

    # -- writing -------------------------------------------------------------------
    def backfill(self) -> int:
        """Record the committed steps of this task's runs that the ledger lacks: runs made before it
        existed, or a kill between a step's commit and its entry. A run whose every committed step is
        in the ledger is not read again, so this costs a directory listing per run once done."""
        cfg, known, added = self.store.config, self.ledger.by_run(), 0
        for store in list_runs(self.root):
            try:
                other = store.config
            except RunError:
                continue  # a damaged run: `optagent runs` names it
            if (other.task_name, other.task_digest) != (cfg.task_name, cfg.task_digest):
                continue
            have = known.get(other.run_id, {})
            if len(have) >= len(list(store.path.glob("steps/*/step.json"))):
                continue
            try:
                steps = store.steps()
            except RunError:
                continue
            prior = dict(have)
            for step in steps:
                entry = self._entry(store, step, prior)
                prior[step.index] = entry
                added += self.ledger.append(entry)
        return added

    def record(self, step: Step) -> None:
        """A step just committed (its step.json and candidate written) goes into the ledger."""
        entry = self._entry(self.store, step, self._mine)
        self.ledger.append(entry)
        self._mine[step.index] = entry

    def _entry(self, store: RunStore, step: Step, prior: dict[int, LedgerEntry]) -> LedgerEntry:
        cfg = store.config
        kernel = store.step_dir(step.index) / f"candidate{cfg.language.ext}"
        try:
            source = str(kernel.relative_to(self.root))
        except ValueError:
            source = str(kernel.resolve())
        try:
            proposal = store.proposal(step.index)
        except RunError:
            proposal = None
        # a step that failed before the worker said hello has no device name: it ran where its run's others did
        name = next((e.device_name for _, e in sorted(prior.items()) if e.device_name), None)
        return make_entry(cfg.run_id, step, planner=cfg.planner, bench=Bench(cfg.device, name, cfg.language, cfg.cases),
                          source=source, meta=proposal.meta if proposal else None,
                          incumbent_us=incumbent_time(prior, step.index, step.parent))

    def summary(self) -> str:
        earlier = [e for e in self.ledger.entries() if e.run_id != self.run_id]
        runs = len({e.run_id for e in earlier})
        said = f"ledger {self.ledger.path}: {len(earlier)} step(s) of {runs} earlier run(s)"
        if self.backfilled:
            said += f" ({self.backfilled} of them read in from step files the ledger lacked)"
        return said + ("; --fresh: none of it is used" if self.fresh and earlier else "")

    # -- reading -------------------------------------------------------------------
    @property
    def bench(self) -> Bench:
        cfg = self.store.config
        name = next((e.device_name for _, e in sorted(self._mine.items()) if e.device_name), None)
        return Bench(cfg.device, name, cfg.language, cfg.cases)

    def recall(self) -> Optional[Recall]:
        """What earlier runs found (None with --fresh, or when there were none); read afresh each time,
        so that runs on the task at the same time learn from each other's entries too."""
        if self.fresh:
            return None
        entries = [e for e in self.ledger.entries() if e.run_id != self.run_id]
        if not entries:
            return None
        ranked = best_per_bench(entries)
        bench = self.bench
        best = next((KnownBest(e, src) for e in ranked.get(bench, []) if (src := self._source(e)) is not None), None)
        return Recall(entries, bench, best, {b: es[0] for b, es in ranked.items()})

    def _source(self, entry: LedgerEntry) -> Optional[str]:
        """The entry's kernel from its run's step files; None when that run is gone or the file changed."""
        sha = entry.kernel_sha256
        if sha not in self._sources:
            try:
                text = (self.root / entry.source).read_bytes().decode("utf-8") if entry.source else None
            except (OSError, UnicodeDecodeError):
                text = None
            self._sources[sha] = text if text is not None and _sha(text) == sha else None
        return self._sources[sha]


def describe_bench(bench: Bench) -> str:
    where = bench.device_name or bench.device.value
    cases = f", cases {bench.cases}" if bench.cases else ""
    return f"{where}{'' if where == bench.device.value else f' ({bench.device.value})'}, {bench.language.value}{cases}"

