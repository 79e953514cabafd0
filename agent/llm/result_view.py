"""A result as the prompt shows it: its table (only the columns that carry anything), its failing
cases grouped, the line an error names, what the compiler and the profiler reported."""

from __future__ import annotations

from typing import Any, Optional

from optagent.llm import feedback as fb
from optagent.llm.profile_view import profile_rows
from optagent.ranking import timings_rank
from optagent.schema import CaseKind, EvalResult, FloorKind, Status

_ERROR_LINES, _ERROR_CHARS = 40, 3000
_LOG_LINES = 30
QUIET = (Status.PASSED, Status.INCORRECT)  # statuses whose log tail the prompt leaves out


def trim(text: Optional[str], max_lines: int = _ERROR_LINES, max_chars: int = _ERROR_CHARS) -> str:
    """Head and tail of a long error: the first lines name the error, the last the failing frame."""
    if not text:
        return ""
    lines = text.strip("\n").split("\n")
    if len(lines) > max_lines:
        head, tail = max_lines // 3, max_lines - max_lines // 3
        lines = lines[:head] + [f"... ({len(lines) - head - tail} lines cut) ..."] + lines[-tail:]
    out = "\n".join(lines)
    if len(out) > max_chars:
        half = max_chars // 2
        out = out[:half] + f"\n... ({len(out) - 2 * half} characters cut) ...\n" + out[-half:]
    return out


def num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def case_rows(result: EvalResult) -> list[dict[str, str]]:
    return [
        {
            "case": c.case,
            "sizes": c.sizes or "-",
            "status": c.status.value,
            "time_us": num(c.time_us, ".2f"),
            "baseline_us": num(c.baseline_us, ".2f"),
            "speedup": num(c.speedup, ".3f"),
            # an estimated floor (no bytes_moved hook) is marked as one, as in the CLI
            "floor_pct": (f"~{c.pct_of_floor:.0f} est." if c.floor_kind is FloorKind.ESTIMATE and c.pct_of_floor
                          else num(c.pct_of_floor, ".1f")),
            "bound": c.bound or "-",
            "tolerance": num(c.tolerance, ".1e"),
            "rel_err": num(c.rel_err, ".1e"),
        }
        for c in result.cases if c.kind is not CaseKind.HIDDEN
    ]


def hidden_summary(result: EvalResult) -> Optional[dict[str, Any]]:
    """The hidden cases as one line (their sizes are not shown, so a row each says little): how many, how
    many passed, and the largest error among them."""
    hidden = [c for c in result.cases if c.kind is CaseKind.HIDDEN]
    if not hidden:
        return None
    errors = [c.rel_err for c in hidden if c.rel_err is not None]
    return {"count": len(hidden), "passed": sum(c.status is Status.PASSED for c in hidden),
            "max_err": num(max(errors) if errors else None, ".1e")}


def columns(rows: list[dict[str, str]], on_cpu: bool) -> dict[str, bool]:
    """Which optional columns carry anything: on the CPU no time (interpreter times rank nothing), and
    no floor or bound column that is '-' in every row."""
    def filled(key: str) -> bool:
        return any(r[key] != "-" for r in rows)
    return {"times": not on_cpu, "floor": not on_cpu and filled("floor_pct"), "bound": not on_cpu and filled("bound"),
            "tolerance": filled("tolerance")}


def result_view(result: Optional[EvalResult], source: Optional[str] = None,
                 hidden_failed: int = 0) -> Optional[dict[str, Any]]:
    if result is None:
        return None
    log_tail = trim(result.log_tail, _LOG_LINES) if result.log_tail else ""
    reason = trim(result.reason)
    return {
        "status": result.status.value,
        "reason": reason,
        # a wrong result's log holds the interpreter's warnings, not its cause: only errors keep theirs
        "log_tail": "" if (log_tail and log_tail in reason) or result.status in QUIET else log_tail,
        "geomean": num(result.geomean_speedup, ".3f"),
        "device_name": result.device_name or result.device,
        "baseline_label": result.baseline_label or "the package's baseline",
        "rows": case_rows(result),
        "hidden": hidden_summary(result),
        "floor_estimated": any(c.floor_kind is FloorKind.ESTIMATE and c.pct_of_floor for c in result.cases),
        "columns": columns(case_rows(result), not timings_rank(results=[result])),
        "groups": fb.failing_groups(result),
        "kernels": fb.kernel_lines(result),
        "profile": profile_rows(result),
        "error_at": fb.error_at(result, source),
        "hidden_failed": hidden_failed,
    }
