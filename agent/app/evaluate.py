"""One kernel judged on its own, outside any run: `optagent eval` and the MCP `evaluate` tool alike."""

from __future__ import annotations

from typing import Callable, Optional

from optagent.app.build import build_evaluator, profile_notice
from optagent.evaluation.evaluator import TIMEOUT_S
from optagent.progress import ProgressSink
from optagent.schema import Device, EvalResult, Language
from optagent.task import TaskPackage


def evaluate(task: TaskPackage, source: str, language: Language, device: Device, cases: Optional[str] = None, *,
             hidden: bool = True, timeout_s: float = TIMEOUT_S, compiler: Optional[str] = None,
             keep_scratch: bool = False, profile: bool = False, progress: Optional[ProgressSink] = None,
             notice: Callable[[str], None] = lambda line: None) -> EvalResult:
    """The sandboxed evaluation of `source` on `cases` (a bad list is a CaseListError, before anything
    runs); notice hears --profile's line (where ncu is, or that there is none) before the evaluation."""
    evaluator = build_evaluator(task, device, cases, hidden=hidden, timeout_s=timeout_s, compiler=compiler,
                                keep_scratch=keep_scratch, profile=profile, target_facts=True)
    if profile:
        notice(profile_notice(evaluator))
    return evaluator.evaluate(source, language, progress=progress)
