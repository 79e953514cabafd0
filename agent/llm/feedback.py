"""What a failed attempt tells the model: every failing case, the source line an error points at,
the diff against the kernel it was made from, the judge's tolerance and the accept rule.

Pure text work on records the planner already has (an Attempt's result and source); the
views returned here are rendered by prompts/feedback.j2.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Optional

from optagent.integrity import CUDA_FORBIDDEN, FORBIDDEN_ATTRS, FORBIDDEN_NAMES, TORCH_FORBIDDEN
from optagent.runs.view import Attempt
from optagent.schema import EvalResult, Language, Status, StepOutcome

WINDOW = 4  # source lines shown either side of the line an error names
GROUP_CASES_MAX = 12  # case labels listed per group of identical errors
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.IGNORECASE)
# Triton's CompilationError: "at 12:8:" then up to 12 lines of the jit function, a caret line, the error.
_TRITON_AT = re.compile(r"\bat (\d+):(\d+):\n((?:.*\n)*?)\s*\^\s*(?:\n|$)")
_DEF = re.compile(r"^\s*def\s+\w+\s*\(")
_PATTERNS = (
    re.compile(r"\(line (\d+)\)"),  # ours: python_syntax_error, backends, verdict's traceback line
    re.compile(r"\.(?:cu|cuh|cpp)\((\d+)\): (?:error|catastrophic)"),  # nvcc
    re.compile(r"\.(?:cu|cuh|cpp):(\d+):\d+: (?:fatal )?error"),  # gcc / clang
    re.compile(r"\bline (\d+)\b"),
)


@dataclass(frozen=True)
class Rules:
    """How the judge checks and how the loop accepts, for the prompt; None where not known."""

    tolerance_factor: Optional[float] = None
    min_tolerance: Optional[float] = None
    min_gain: Optional[float] = None
    clear_gain: Optional[float] = None
    device: Optional[str] = None  # the run's device ("cpu", "cuda")
    contest_cases: tuple[str, ...] = ()  # each contest case's argument sizes (getTestCaseSize), "1: 1x4096, 4096"
    check_source: Optional[str] = None  # the task's own check(), where it (not a tolerance) decides correctness

    def view(self) -> dict[str, Any]:
        return {"device": self.device, "tolerance_factor": self.tolerance_factor, "min_tolerance": self.min_tolerance,
                "contest_cases": list(self.contest_cases), "check_source": self.check_source,
                "min_gain_pct": None if self.min_gain is None else f"{self.min_gain:.0%}",
                "clear_gain_pct": None if self.clear_gain is None else f"{self.clear_gain:.0%}"}


CHECK_MAX_LINES = 40


def check_source(config_text: str) -> Optional[str]:
    """The source of the ``check`` function a contest testcase_config defines (the package's own, trusted
    text), cut to CHECK_MAX_LINES; None when there is none."""
    try:
        tree = ast.parse(config_text)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            # the segment starts at `def`, its body keeps the file's indentation: indent the first line alike
            text = textwrap.dedent(" " * node.col_offset + (ast.get_source_segment(config_text, node) or ""))
            lines = text.rstrip().split("\n")
            cut = lines[:CHECK_MAX_LINES] + ([f"# ... ({len(lines) - CHECK_MAX_LINES} more lines)"]
                                             if len(lines) > CHECK_MAX_LINES else [])
            return "\n".join(cut) or None
    return None


def case_sizes(index: int, sizes: list[list[int]]) -> str:
    """A contest case's argument sizes as one line: "3: 16x4096, 4096, scalar"."""
    return f"{index}: " + ", ".join("x".join(map(str, s)) if s else "scalar" for s in sizes)


def scan_rules(language: Language) -> dict[str, Any]:
    """The static scan's rules (integrity.py), stated before a rejection costs an attempt."""
    if language is Language.CUDA:
        return {"cuda": sorted(set(CUDA_FORBIDDEN.values()))}
    return {"cuda": [], "names": sorted(FORBIDDEN_NAMES), "torch_forbidden": sorted(TORCH_FORBIDDEN),
            "attrs": sorted(set(FORBIDDEN_ATTRS.values()))}


def _triton_line(text: str, lines: list[str]) -> Optional[int]:
    m = _TRITON_AT.search(text)
    if not m:
        return None
    rel = int(m.group(1))
    excerpt = [ln for ln in m.group(3).split("\n") if ln.strip()]
    if not excerpt:
        return None
    wanted = excerpt[-1].strip()
    # The excerpt's line numbers count from the jit function's `def` line.
    for d, line in enumerate(lines):
        if _DEF.match(line) and d + rel - 1 < len(lines) and lines[d + rel - 1].strip() == wanted:
            return d + rel
    same = [i + 1 for i, line in enumerate(lines) if line.strip() == wanted]
    return same[0] if len(same) == 1 else None


def error_line(text: Optional[str], source: Optional[str]) -> Optional[int]:
    """The 1-based line of ``source`` that an error message points at, or None."""
    if not text or not source:
        return None
    lines = source.split("\n")
    found = _triton_line(text, lines)
    if found:
        return found
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            n = int(m.group(1))
            if 1 <= n <= len(lines):
                return n
    return None


def source_window(source: str, line: int, radius: int = WINDOW) -> str:
    """Lines around ``line`` (1-based), numbered, the line itself marked '>'."""
    lines = source.split("\n")
    lo, hi = max(1, line - radius), min(len(lines), line + radius)
    width = len(str(hi))
    return "\n".join(f"{'>' if i == line else ' '}{i:>{width}} | {lines[i - 1]}" for i in range(lo, hi + 1))


def error_at(result: EvalResult, source: Optional[str]) -> Optional[dict[str, Any]]:
    """The line a compile or run error names, and the candidate's source around it."""
    if source is None or result.status.ok:
        return None
    texts = [result.reason] + [c.reason for c in result.cases if c.reason and not c.status.ok]
    for text in texts:
        n = error_line(text, source)
        if n:
            return {"line": n, "text": source.split("\n")[n - 1].strip(), "window": source_window(source, n)}
    return None


def failing_groups(result: EvalResult) -> list[dict[str, Any]]:
    """Every failing case, those failing alike (same status, same message up to its numbers) together."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for c in result.cases:
        if c.status.ok:
            continue
        reason = c.reason or ""
        key = (c.status.value, _NUMBER.sub("#", reason))
        g = groups.setdefault(key, {"status": c.status.value, "reason": reason, "cases": [], "errors": [],
                                    "identical": True})
        g["cases"].append(c.case)
        g["identical"] = g["identical"] and reason == g["reason"]
        if c.rel_err is not None and c.status is Status.INCORRECT:
            tol = "-" if c.tolerance is None else f"{c.tolerance:.2e}"
            g["errors"].append(f"case {c.case}: rel_err {c.rel_err:.2e} vs tolerance {tol}")
    out = []
    for g in groups.values():
        shown = g["cases"][:GROUP_CASES_MAX]
        more = len(g["cases"]) - len(shown)
        out.append({**g, "count": len(g["cases"]), "labels": ", ".join(shown) + (f" and {more} more" if more else ""),
                    "skipped": g["status"] == Status.SKIPPED.value})
    return out


def run_device(rules: Rules, attempts: list[Attempt]) -> Optional[str]:
    """The run's device: from its config where the planner was told it, else from any result."""
    if rules.device:
        return rules.device
    return next((a.result.device.value for a in attempts if a.result is not None), None)


def retime_notes(attempts: list[Attempt], last: int = 3) -> list[dict[str, Any]]:
    """The notes of the last comparisons that decided acceptance (re-timed or not)."""
    noted = [a for a in attempts if a.retime_note]
    return [{"index": a.index, "outcome": a.outcome, "note": a.retime_note} for a in noted[-last:]]


def ledger_summary(older: list[Attempt]) -> Optional[dict[str, Any]]:
    """The attempts too old for the ledger's table, in a few counts, so the prompt stays bounded."""
    if not older:
        return None
    counts: dict[str, int] = {}
    for a in older:
        what = a.outcome
        if a.result is not None and not a.result.status.ok:
            what = f"{a.outcome} ({a.result.status.value})"
        counts[what] = counts.get(what, 0) + 1
    accepted = [f"step {a.index}: {a.idea}" for a in older if a.outcome == StepOutcome.ACCEPTED.value]
    return {"count": len(older), "first": older[0].index, "last": older[-1].index,
            "counts": ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda kv: -kv[1])),
            "accepted": accepted[-10:]}


def kernel_lines(result: EvalResult) -> list[str]:
    """One line per compiled kernel of a result (the first case that reports it)."""
    seen: dict[str, str] = {}
    for c in result.cases:
        for k in c.kernels:
            if k.name in seen:
                continue
            parts = [f"{k.registers} registers" if k.registers is not None else None,
                     f"{k.spill_bytes} B spilled" if k.spill_bytes is not None else None,
                     f"{k.shared_bytes / 1024:.1f} KiB shared" if k.shared_bytes is not None else None,
                     f"{k.warps} warps" if k.warps else None,
                     # stages pipeline loads through shared memory: with none, the number says nothing
                     f"{k.stages} stages" if k.stages and k.shared_bytes else None,
                     f"occupancy {k.occupancy:.0%}" if k.occupancy is not None else None]
            built = f"{k.source}, built for {k.target}, not run" if k.target else k.source
            seen[k.name] = f"{k.name} ({built}): " + ", ".join(p for p in parts if p)
    return list(seen.values())
