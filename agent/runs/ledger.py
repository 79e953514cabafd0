"""The ledger of a task: every step of every run on it, in one file of the runs directory.

``RUNS/ledger/<task name>-<digest prefix>.jsonl``, one LedgerEntry per line. Keyed by the
package's digest, as resume is: a measurement holds for the package's own cases, baseline and
checks, so an edited package starts a ledger of its own (its old one stays beside it). One JSON
Lines file rather than a file per entry: ``cat``/``jq``/``grep`` read it, a reader reads one
file however many runs there were, and it is read incrementally (only the bytes appended since).

Several runs on one task may append at once: each entry is one ``write()`` on an O_APPEND
descriptor under an flock of the file, so lines never interleave. A kill mid-write leaves a
torn last line; the next writer ends it with a newline first, and readers skip any line that is
not a valid entry (never fatal). An entry already present (same run, step and commit time: a
run re-recording what it committed, two runs backfilling the same old run) is not written
again; a step evaluated anew (a later commit of the same run and step) replaces the earlier
entry when read.
"""

from __future__ import annotations

import fcntl
import os
import re
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, Optional

from pydantic import Field, ValidationError

from optagent.text import first_line
from optagent.runs.view import as_attempt
from optagent.schema import Device, EvalResult, Language, PlannerKind, Record, Status, Step, StepOutcome, now
from optagent.runs.files import RunError

LEDGER_DIR = "ledger"
DIGEST_CHARS = 12
SETTING_KEYS = ("strategy", "knobs")  # the offline planner's proposal meta: which strategy, which knob values


class Bench(NamedTuple):
    """Where a measurement holds: timings and verdicts compare only within one bench."""

    device: Device
    device_name: Optional[str]
    language: Language
    cases: Optional[str]  # the run's --cases (None: the device's default cases)


class LedgerEntry(Record):
    run_id: str
    step: int = Field(ge=0)
    parent: Optional[int] = None  # the step whose kernel this one changed (None: the incumbent)
    idea: str
    setting: Optional[dict] = None  # the offline planner's strategy and knob values
    planner: PlannerKind
    outcome: StepOutcome
    status: Optional[Status] = None  # None: no kernel was evaluated
    reason: Optional[str] = None  # why it failed, first line
    geomean_time_us: Optional[float] = None
    speedup: Optional[float] = None  # geomean over the baseline timed in the same evaluation
    gain: Optional[float] = None  # parent's (else incumbent's) geomean time / this one's - 1
    device: Device
    device_name: Optional[str] = None
    language: Language
    cases: Optional[str] = None
    kernel_sha256: Optional[str] = None
    source: Optional[str] = None  # the kernel's file, relative to the runs directory
    finished_at: datetime
    recorded_at: datetime = Field(default_factory=now)

    @property
    def key(self) -> tuple[str, int]:
        return self.run_id, self.step

    @property
    def bench(self) -> Bench:
        return Bench(self.device, self.device_name, self.language, self.cases)

    @property
    def evaluated(self) -> bool:
        return self.status is not None and self.kernel_sha256 is not None


def _stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def ledger_path(root: Path, task_name: str, task_digest: str) -> Path:
    return root / LEDGER_DIR / f"{_stem(task_name)}-{_stem(task_digest[:DIGEST_CHARS])}.jsonl"


def ledger_files(root: Path, task_name: str) -> list[Path]:
    """The task's ledgers, one per version of its package."""
    return sorted(p for p in (root / LEDGER_DIR).glob("*.jsonl") if p.stem.rsplit("-", 1)[0] == _stem(task_name))


def _reason(step: Step) -> Optional[str]:
    """Why the step failed, as planners may see it: a hidden case's details stay out (runs/view.as_attempt)."""
    if step.outcome.has_kernel:
        return None
    shown = as_attempt(step).result
    return first_line(shown.reason if shown is not None else step.error, 200)


def make_entry(run_id: str, step: Step, *, planner: PlannerKind, bench: Bench, source: Optional[str],
               meta: Optional[dict], incumbent_us: Optional[float]) -> LedgerEntry:
    """A committed step as the ledger keeps it; ``source`` is its kernel's path under the runs directory."""
    result: Optional[EvalResult] = step.result
    time_us = result.geomean_time_us if result else None
    setting = {k: meta[k] for k in SETTING_KEYS if k in meta} if meta else None
    return LedgerEntry(
        run_id=run_id, step=step.index, parent=step.parent, idea=step.idea,
        setting=setting or None, planner=planner, outcome=step.outcome, status=result.status if result else None,
        reason=_reason(step),
        geomean_time_us=time_us, speedup=result.geomean_speedup if result else None,
        gain=incumbent_us / time_us - 1 if incumbent_us and time_us else None,
        device=bench.device, device_name=(result.device_name if result and result.device_name else bench.device_name),
        language=bench.language, cases=bench.cases, kernel_sha256=step.candidate_sha256,
        source=source if step.candidate_sha256 else None, finished_at=step.finished_at)


class Ledger:
    """One task's ledger file: appended to under a lock, read (incrementally) without one."""

    def __init__(self, path: Path):
        self.path = path
        self._entries: dict[tuple[str, int], LedgerEntry] = {}  # the latest entry per (run, step)
        self._offset = 0  # bytes of the file already read
        self.skipped = 0  # lines that were not valid entries (torn by a kill, edited by hand)

    def entries(self) -> list[LedgerEntry]:
        """Every entry, one per (run, step), in the order first recorded."""
        self._refresh()
        return list(self._entries.values())

    def _refresh(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        except OSError as e:
            raise RunError(f"{self.path}: cannot read: {e.strerror or e}") from None
        end = data.rfind(b"\n") + 1  # a last line without its newline is still being written (or torn)
        for line in data[:end].splitlines():
            if line.strip():
                self._take(line)
        self._offset += end

    def _take(self, line: bytes) -> None:
        try:
            entry = LedgerEntry.model_validate_json(line)
        except ValidationError:
            self.skipped += 1
            return
        old = self._entries.get(entry.key)
        if old is None or entry.finished_at >= old.finished_at:
            self._entries[entry.key] = entry

    def has(self, entry: LedgerEntry) -> bool:
        old = self._entries.get(entry.key)
        return old is not None and old.finished_at == entry.finished_at

    def append(self, entry: LedgerEntry) -> bool:
        """Write the entry unless it is there already; False when it was."""
        line = entry.model_dump_json().encode() + b"\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunError(f"{self.path}: cannot write: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._refresh()  # what other writers appended: the entry may be among it
            if self.has(entry):
                return False
            size = os.fstat(fd).st_size
            if size and _last_byte(self.path, size) != b"\n":
                line = b"\n" + line  # end a line torn by a killed writer: this entry stays whole
            if os.write(fd, line) != len(line):
                raise OSError(28, "short write (disk full?)")
            os.fsync(fd)
        except OSError as e:
            raise RunError(f"{self.path}: cannot write: {e.strerror or e}") from None
        finally:
            os.close(fd)  # releases the lock
        self._take(line.strip())
        self._offset = max(self._offset, size + len(line))
        return True

    def by_run(self) -> dict[str, dict[int, LedgerEntry]]:
        out: dict[str, dict[int, LedgerEntry]] = {}
        for e in self.entries():
            out.setdefault(e.run_id, {})[e.step] = e
        return out


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)


def incumbent_time(prior: dict[int, LedgerEntry], index: int, parent: Optional[int]) -> Optional[float]:
    """The geomean time a step is measured against: its parent's, else the latest kernel its run kept before it."""
    if parent is not None:
        return prior[parent].geomean_time_us if parent in prior else None
    kept = [e for i, e in sorted(prior.items()) if i < index and e.outcome.keeps_best]
    return kept[-1].geomean_time_us if kept else None

