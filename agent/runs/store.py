"""Run state on disk: ``runs/<run_id>/``, readable with cat and jq.

Layout::

    config.json            RunConfig (with the task package's digest)
    state.json             RunState, rewritten after every step (its totals follow the steps on resume)
    starter.<ext>          the kernel the run started from
    steps/0003/            one folder per step
        proposal.json      the planner's proposal: idea, request, reply, usage
        candidate.<ext>    the source evaluated
        result.json        EvalResult (a copy of step.json's result, written just before it)
        step.json          Step - the step's commit, written last in one rename: it holds the step's
                           result and, when the step changed the best kernel or its timing, ``best``
                           (which step's kernel is the best, its latest result). A step without it is
                           unfinished: evaluated again on resume, whatever else its folder holds.
    best/kernel.<ext>, best/result.json, best/diff.patch
                           a cache for people and exports, rewritten after the commit that changed it;
                           the run's best is the one named by the latest commit, so a kill before the cache
                           is written is repaired on resume
    lock                   flock()ed by the process driving the run: a run whose
                           state says RUNNING but whose lock is free was killed

Every file goes through ``run_files``: written atomically, and read by one
reader that turns damage into a one-line RunError naming the file.
The loop reads a run once, when it starts or resumes (``trajectory.py``), then
writes each step's files once; on start it removes what a crash left behind
(temp files, an unfinished step's result).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from functools import cached_property
from pathlib import Path
from typing import Iterator, Optional

from pydantic import BaseModel

from optagent.schema import FORMAT_VERSION, EvalResult, Language, Proposal, RunConfig, RunState, Step
from optagent.runs import files as run_files
from optagent.settings import RUNS_DIR_ENV, settings
from optagent.runs.files import RunError, unified_diff

LOCK_WAIT_S = 1.0  # a reader's probe holds the lock for microseconds; a driver waits that out


def runs_dir(arg: Optional[str]) -> Path:
    env = settings().runs_dir
    path = Path(arg or env or "runs")
    # A file on the way would fail the first write with a traceback; name where the path came from.
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = f"--runs-dir {arg}" if arg else f"{RUNS_DIR_ENV}={env}" if env else str(path)
        raise RunError(f"{where}: " + ("not a directory" if existing == path else f"{existing} is not a directory"))
    return path


def new_run_id(task_name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    salt = hashlib.sha256(f"{time.time_ns()}{os.getpid()}".encode()).hexdigest()[:6]
    return f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', task_name)}-{salt}"


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
        run_files.atomic_write(path / "config.json", config.model_dump_json(indent=2))
        run_files.atomic_write(path / f"starter{config.language.ext}", starter)
        return store

    @classmethod
    def open(cls, root: Path, run_id: str) -> "RunStore":
        """The exact id under ``root``, a run directory's path, or a unique prefix (else a unique part) of an id."""
        is_path = os.sep in run_id or run_id in (".", "..") or run_id.startswith("~")
        if run_id and not is_path and (root / run_id / "config.json").is_file():
            return cls(root / run_id)
        given = Path(run_id).expanduser()
        if run_id and (given / "config.json").is_file():
            return cls(given)
        if is_path:
            raise RunError(f"{given}: " + ("not a run directory (no config.json)" if given.is_dir() else
                                           "no such run directory"))
        if not run_id:
            raise RunError(f"{root}: no run id given")
        names = [s.path.name for s in list_runs(root)]
        matches = [n for n in names if n.startswith(run_id)] or [n for n in names if run_id in n]
        if not matches:
            raise RunError(f"{root / run_id}: no such run")
        if len(matches) > 1:
            shown = ", ".join(matches[:8]) + (f", and {len(matches) - 8} more" if len(matches) > 8 else "")
            raise RunError(f"{run_id!r} matches {len(matches)} runs: {shown}")
        return cls(root / matches[0])

    def lock(self) -> None:
        fh = open(self.path / "lock", "a+")
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.close()
                    raise RunError(f"{self.path}: another optagent process is driving this run") from None
                time.sleep(0.05)
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

    def driven(self) -> bool:
        """Whether a live process holds this run's lock (a kill -9 releases it with the process)."""
        try:
            fd = os.open(self.path / "lock", os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def ever_driven(self) -> bool:
        return (self.path / "lock").exists()

    def driver_pid(self) -> Optional[int]:
        try:
            text = (self.path / "lock").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    # -- reading: every file through run_files, the one reader ------------------
    @cached_property
    def config(self) -> RunConfig:  # written at creation; changed only by hand-over (save_config)
        config = run_files.read_record(self.path / "config.json", RunConfig)
        if config.format_version < FORMAT_VERSION:
            raise RunError(f"{self.path / 'config.json'}: a run of format version {config.format_version}; this "
                           f"optagent reads version {FORMAT_VERSION} (runs made since step commits and rounds)")
        return config

    def save_config(self, config: RunConfig) -> None:
        """A run handed to another planner (resume --planner), or to its task package's new place."""
        run_files.atomic_write(self.path / "config.json", config.model_dump_json(indent=2))
        self.__dict__["config"] = config

    def state(self) -> Optional[RunState]:
        p = self.path / "state.json"
        return run_files.read_record(p, RunState) if p.exists() else None

    @cached_property
    def starter(self) -> str:  # written once, at creation
        return run_files.read_text(self.path / f"starter{self.config.language.ext}")

    def step_dir(self, index: int) -> Path:
        return self.path / "steps" / f"{index:04d}"

    def _step_dirs(self) -> list[Path]:
        return sorted(d for d in (self.path / "steps").glob("[0-9]*") if d.name.isdigit() and d.is_dir())

    def steps(self) -> list[Step]:
        return [run_files.read_record(d / "step.json", Step) for d in self._step_dirs() if (d / "step.json").is_file()]

    def step_source(self, index: int) -> Optional[str]:
        found = list(self.step_dir(index).glob("candidate.*"))
        return run_files.read_text(found[0]) if found else None

    def proposal(self, index: int) -> Optional[Proposal]:
        p = self.step_dir(index) / "proposal.json"
        return run_files.read_record(p, Proposal) if p.exists() else None

    def unfinished_steps(self) -> list[tuple[int, Proposal]]:
        """Steps whose proposal was saved but whose evaluation never finished, in order."""
        return [(int(d.name), run_files.read_record(d / "proposal.json", Proposal)) for d in self._step_dirs()
                if not (d / "step.json").exists() and (d / "proposal.json").exists()]

    def unfinished(self) -> Optional[tuple[int, Proposal]]:
        """The first step whose proposal was saved but whose evaluation never finished."""
        pending = self.unfinished_steps()
        return pending[0] if pending else None

    def best(self) -> Optional[tuple[str, EvalResult]]:
        kernels = list((self.path / "best").glob("kernel.*"))
        res = self.path / "best" / "result.json"
        if not kernels or not res.exists():
            return None
        return run_files.read_text(kernels[0]), run_files.read_record(res, EvalResult)

    def damage(self) -> list[RunError]:
        """Every damaged record of the run (each named), for listings that go on past one."""
        found: list[RunError] = []

        def check(path: Path, model: Optional[type[BaseModel]] = None) -> None:
            try:
                if model:
                    run_files.read_record(path, model)
                else:
                    run_files.read_text(path)
            except RunError as e:
                found.append(e)

        check(self.path / "config.json", RunConfig)
        if not found:
            check(self.path / f"starter{self.config.language.ext}")
        for name, model in (("state.json", RunState), ("best/result.json", EvalResult)):
            if (self.path / name).exists():
                check(self.path / name, model)
        for kernel in (self.path / "best").glob("kernel.*"):
            check(kernel)
        for d in self._step_dirs():
            for name, model in (("proposal.json", Proposal), ("result.json", EvalResult), ("step.json", Step)):
                if (d / name).exists():
                    check(d / name, model)
        return found

    # -- writing: every file through run_files.atomic_write -----------------------
    def save_candidate(self, index: int, source: str, language: Language) -> None:
        run_files.atomic_write(self.step_dir(index) / f"candidate{language.ext}", source)

    def save_proposal(self, index: int, proposal: Proposal, language: Language) -> None:
        if proposal.source is not None:  # first: a saved proposal always has its candidate beside it
            self.save_candidate(index, proposal.source, language)
        run_files.atomic_write(self.step_dir(index) / "proposal.json", proposal.model_dump_json(indent=2))

    def save_step(self, step: Step) -> None:
        """The step's commit: its result's copy, then step.json (with the best it leaves) in one rename."""
        d = self.step_dir(step.index)
        if step.result is not None:
            run_files.atomic_write(d / "result.json", step.result.model_dump_json(indent=2))
        run_files.atomic_write(d / "step.json", step.model_dump_json(indent=2))  # last: the step is finished

    def save_best(self, source: str, result: EvalResult) -> None:
        """The best/ cache. The kernel goes last: a kernel and result that match the commit imply its diff."""
        language = self.config.language
        d = self.path / "best"
        run_files.atomic_write(d / "diff.patch", unified_diff(self.starter, source, f"starter{language.ext}",
                                                              f"best{language.ext}"))
        run_files.atomic_write(d / "result.json", result.model_dump_json(indent=2))
        run_files.atomic_write(d / f"kernel{language.ext}", source)

    def remove_leftovers(self) -> list[Path]:
        """What a crash left behind, removed by the process about to drive the run: temp files, the result of
        a step never committed (evaluated again), a step folder whose proposal was never saved."""
        gone = [p for p in self.path.rglob(f".*{run_files.TMP_SUFFIX}") if p.is_file()]
        for d in self._step_dirs():
            if (d / "step.json").exists():
                continue
            if (d / "proposal.json").exists():
                gone += [p for p in (d / "result.json",) if p.exists()]
            else:
                gone += [p for p in d.iterdir() if p.is_file()]
        for p in gone:
            p.unlink(missing_ok=True)
        for d in self._step_dirs():
            if not any(d.iterdir()):
                d.rmdir()
        return gone

    def save_state(self, state: RunState) -> None:
        run_files.atomic_write(self.path / "state.json", state.model_dump_json(indent=2))


def list_runs(root: Path) -> Iterator[RunStore]:
    if not root.is_dir():
        return iter(())
    return (RunStore(p) for p in sorted(root.iterdir()) if (p / "config.json").is_file())
