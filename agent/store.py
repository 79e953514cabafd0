"""Run state on disk: ``runs/<run_id>/``, readable with cat and jq.

Layout::

    config.json            RunConfig (with the task package's digest)
    state.json             RunState, rewritten after every step
    starter.<ext>          the kernel the run started from
    steps/0003/            one folder per step
        proposal.json      the planner's proposal: idea, request, reply, usage
        candidate.<ext>    the source evaluated
        result.json        EvalResult
        step.json          Step - written last: a step without it is unfinished
    best/kernel.<ext>, best/result.json, best/diff.patch
                           result.json: the best kernel's latest timing (re-timed
                           side by side with a candidate); its step keeps the first
    lock                   flock()ed by the process driving the run

Every file is written atomically (temp file, fsync, rename), so SIGKILL at any
moment leaves each file either old or new, never half-written.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import os
import re
import time
from pathlib import Path
from typing import Iterator, Optional

from .schema import EvalResult, Language, Proposal, RunConfig, RunState, Step


class RunError(Exception):
    """A run that cannot be opened or driven; the message is one line."""


def ext(language: Language) -> str:
    return ".cu" if language is Language.CUDA else ".py"


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def runs_dir(arg: Optional[str]) -> Path:
    env = os.environ.get("OPTAGENT_RUNS_DIR") or None
    path = Path(arg or env or "runs")
    # A file on the way would fail the first write with a traceback; name where the path came from.
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = f"--runs-dir {arg}" if arg else f"OPTAGENT_RUNS_DIR={env}" if env else str(path)
        raise RunError(f"{where}: " + ("not a directory" if existing == path else f"{existing} is not a directory"))
    return path


def new_run_id(task_name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    salt = hashlib.sha256(f"{time.time_ns()}{os.getpid()}".encode()).hexdigest()[:6]
    return f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', task_name)}-{salt}"


def unified_diff(a: str, b: str, a_name: str = "starter", b_name: str = "best") -> str:
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        fromfile=a_name, tofile=b_name))


class RunStore:
    def __init__(self, path: Path):
        self.path = path
        self._lock_fh = None

    # -- creation and opening -------------------------------------------------
    @classmethod
    def create(cls, root: Path, config: RunConfig, starter: str) -> "RunStore":
        path = root / config.run_id
        if path.exists():
            raise RunError(f"{path}: run already exists")
        try:
            path.mkdir(parents=True)
        except OSError as e:
            raise RunError(f"{path}: cannot create the run's folder: {e.strerror or e}") from None
        store = cls(path)
        atomic_write(path / "config.json", config.model_dump_json(indent=2))
        atomic_write(path / f"starter{ext(config.language)}", starter)
        return store

    @classmethod
    def open(cls, root: Path, run_id: str) -> "RunStore":
        path = root / run_id
        if not (path / "config.json").is_file():
            matches = sorted(p for p in root.glob(f"*{run_id}*") if (p / "config.json").is_file()) if root.is_dir() else []
            if len(matches) != 1:
                raise RunError(f"{root / run_id}: no such run" + (f" ({len(matches)} match)" if matches else ""))
            path = matches[0]
        return cls(path)

    def lock(self) -> None:
        fh = open(self.path / "lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise RunError(f"{self.path}: another optagent process is driving this run") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._lock_fh = fh

    def unlock(self) -> None:
        if self._lock_fh:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- reading ----------------------------------------------------------------
    @property
    def config(self) -> RunConfig:
        return RunConfig.model_validate_json((self.path / "config.json").read_text())

    def state(self) -> Optional[RunState]:
        p = self.path / "state.json"
        return RunState.model_validate_json(p.read_text()) if p.exists() else None

    @property
    def starter(self) -> str:
        return (self.path / f"starter{ext(self.config.language)}").read_text(encoding="utf-8")

    def step_dir(self, index: int) -> Path:
        return self.path / "steps" / f"{index:04d}"

    def steps(self) -> list[Step]:
        out = []
        for d in sorted((self.path / "steps").glob("[0-9]*")):
            if (d / "step.json").is_file():
                out.append(Step.model_validate_json((d / "step.json").read_text()))
        return out

    def step_source(self, index: int) -> Optional[str]:
        files = list(self.step_dir(index).glob("candidate.*"))
        return files[0].read_text(encoding="utf-8") if files else None

    def proposal(self, index: int) -> Optional[Proposal]:
        p = self.step_dir(index) / "proposal.json"
        return Proposal.model_validate_json(p.read_text()) if p.exists() else None

    def unfinished(self) -> Optional[tuple[int, Proposal]]:
        """A step whose proposal was saved but whose evaluation never finished."""
        for d in sorted((self.path / "steps").glob("[0-9]*")):
            if not (d / "step.json").exists() and (d / "proposal.json").exists():
                return int(d.name), Proposal.model_validate_json((d / "proposal.json").read_text())
        return None

    def best(self) -> Optional[tuple[str, EvalResult]]:
        files = list((self.path / "best").glob("kernel.*"))
        res = self.path / "best" / "result.json"
        if not files or not res.exists():
            return None
        return files[0].read_text(encoding="utf-8"), EvalResult.model_validate_json(res.read_text())

    # -- writing ----------------------------------------------------------------
    def save_proposal(self, index: int, proposal: Proposal, language: Language) -> None:
        d = self.step_dir(index)
        if proposal.source is not None:
            atomic_write(d / f"candidate{ext(language)}", proposal.source)
        atomic_write(d / "proposal.json", proposal.model_dump_json(indent=2))

    def save_step(self, step: Step) -> None:
        d = self.step_dir(step.index)
        if step.result is not None:
            atomic_write(d / "result.json", step.result.model_dump_json(indent=2))
        atomic_write(d / "step.json", step.model_dump_json(indent=2))

    def save_best(self, source: str, result: EvalResult) -> None:
        language = self.config.language
        d = self.path / "best"
        atomic_write(d / f"kernel{ext(language)}", source)
        atomic_write(d / "result.json", result.model_dump_json(indent=2))
        atomic_write(d / "diff.patch", unified_diff(self.starter, source, f"starter{ext(language)}",
                                                    f"best{ext(language)}"))

    def save_state(self, state: RunState) -> None:
        atomic_write(self.path / "state.json", state.model_dump_json(indent=2))


def list_runs(root: Path) -> Iterator[RunStore]:
    if not root.is_dir():
        return iter(())
    return (RunStore(p) for p in sorted(root.iterdir()) if (p / "config.json").is_file())

