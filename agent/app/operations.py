"""What an outside agent may do, once, for both of its front ends: the MCP server and the step commands.

Every operation takes plain values, checks them with a one-line ``OutsideError`` naming what is
wrong, and answers with a pydantic model plus the text ``optagent`` itself would print. Kernel
sources arrive as text, never as paths: an agent reaches no file outside the runs directory and
the task packages the server was started with (``Scope``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field
from rich.console import Console

from optagent.progress import ProgressSink
from optagent.schema import Device, Language, Status
from optagent.task import TaskError, TaskPackage, load_task


class OutsideError(ValueError):
    """A bad tool input or command argument; the message is one line."""


class Scope(BaseModel):
    """The task packages and the runs directory an outside agent may touch, fixed when it starts."""

    tasks: list[Path]
    runs_dir: Path
    device: Optional[Device] = None  # None: cuda when a GPU is visible, else cpu

    def task(self, name_or_path: str) -> TaskPackage:
        """A package of the scope: by its name, its folder's name, or the path it was given as."""
        for root in self.tasks:
            if name_or_path in (root.name, str(root)) or Path(name_or_path).resolve() == root.resolve():
                return self._load(root)
        for root in self.tasks:
            task = self._load(root)
            if task.name == name_or_path:
                return task
        names = ", ".join(r.name for r in self.tasks) or "none"
        raise OutsideError(f"task {name_or_path!r} is not one this server offers (offered: {names})")

    @staticmethod
    def _load(root: Path) -> TaskPackage:
        try:
            return load_task(root)
        except TaskError as e:
            raise OutsideError(str(e)) from None


class CaseRow(BaseModel):
    index: int
    sizes: str
    warmup: int
    iters: int


class Starter(BaseModel):
    language: Language
    file: str
    source: str


class TaskInfo(BaseModel):
    name: str
    title: str
    statement: str
    languages: list[Language]
    contract: dict[str, str] = Field(description="the interface contract of each language asked for")
    cases: list[CaseRow]
    outputs: list[int] = Field(description="indices of run_kernel's arguments that are outputs")
    baseline: str
    starters: list[Starter]
    smoke_cases: int = Field(description="small cases a CPU evaluation runs (Triton's interpreter)")


class Verdict(BaseModel):
    """One evaluation: the full record, and the table `optagent eval` prints."""

    status: Status
    reason: Optional[str] = None
    geomean_speedup: Optional[float] = None
    geomean_time_us: Optional[float] = None
    # the EvalResult as JSON: a model here would give a validation-mode schema without its computed fields
    result: dict[str, Any] = Field(description="every case: status, reason, time_us, baseline_us, speedup, "
                                   "pct_of_floor, rel_err, tolerance; the isolation it ran under")
    table: str


def render(draw: Callable[[Console], None], width: int = 110) -> str:
    """What a rich view prints, as plain text (no colour, no terminal)."""
    buf = io.StringIO()
    draw(Console(file=buf, width=width, color_system=None, force_terminal=False, soft_wrap=True))
    return buf.getvalue().rstrip()


def language_of(task: TaskPackage, language: Optional[str]) -> Language:
    if language is None:
        if not task.languages:
            raise OutsideError(f"{task.root}: the package has no starter in any language")
        return task.languages[0]
    try:
        lang = Language(language)
    except ValueError:
        raise OutsideError(f"language {language!r} is not one of: {', '.join(x.value for x in Language)}") from None
    if lang not in task.languages:
        raise OutsideError(f"{task.root}: no {lang.value} contract or starter in this package "
                           f"(it has: {', '.join(x.value for x in task.languages)})")
    return lang


def task_info(scope: Scope, task_name: str, language: Optional[str] = None) -> TaskInfo:
    from optagent.evaluation.evaluator import probe_task

    task = scope.task(task_name)
    langs = [language_of(task, language)] if language else task.languages
    found = probe_task(task, cached=True)
    contracts = task.contracts
    return TaskInfo(
        name=task.name, title=task.title, statement=task.statement, languages=task.languages,
        contract={lang.value: contracts.get(lang, "") for lang in langs},
        cases=[CaseRow(index=c.index, sizes=" ".join("x".join(map(str, s)) for s in c.sizes), warmup=c.warmup,
                       iters=c.iters) for c in found.cases],
        outputs=found.outputs, baseline=found.baseline_label,
        starters=[Starter(language=s.language, file=s.path.name, source=s.source) for s in task.starters
                  if s.language in langs],
        smoke_cases=len(task.manifest.smoke) if task.manifest else 0)


def device_of(scope: Scope) -> Device:
    from optagent.app.build import resolve_device

    return scope.device or resolve_device(None)


def evaluate(scope: Scope, task_name: str, source: str, language: Optional[str] = None,
             cases: Optional[str] = None, progress: Optional[ProgressSink] = None) -> Verdict:
    """A kernel source, judged as `optagent eval` judges it; a bad kernel is a verdict, not an error."""
    from optagent.app.evaluate import evaluate as evaluate_kernel
    from optagent.report.format import print_eval
    from optagent.evaluation.cases import CaseListError

    if not source.strip():
        raise OutsideError("source is empty: pass the kernel's whole text")
    task = scope.task(task_name)
    lang = language_of(task, language)
    try:
        result = evaluate_kernel(task, source, lang, device_of(scope), cases, progress=progress)
    except (CaseListError, TaskError) as e:
        raise OutsideError(str(e)) from None
    return Verdict(status=result.status, reason=result.reason, geomean_speedup=result.geomean_speedup,
                   geomean_time_us=result.geomean_time_us, result=result.model_dump(mode="json"),
                   table=render(lambda con: print_eval(con, result)))
