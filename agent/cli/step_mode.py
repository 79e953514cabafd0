"""Step mode for outside agents that prefer a shell.

    optagent run TASK --planner external     create the run, evaluate the starter, return
    optagent propose RUN FILE[@STEP]...       evaluate the files as one round, print the feedback
                                              (each file: IDEA + SEARCH/REPLACE against its parent,
                                              a fenced whole file, or raw source; --check: read and
                                              scan only, nothing spent)
    optagent feedback RUN                     print what a planner would be shown next

(`optagent mcp`, the same operations as MCP tools over stdio, is the MCP adapter's: outside/command.py.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from optagent.text import first_line, plain
from optagent.settings import UserError
from optagent.cli.options import add_runs_dir
from optagent.cli.views import human_console, print_json
from optagent.app.operations import OutsideError, Scope
from optagent.app.steps import Feedback
from optagent.runs.store import RunStore, runs_dir


def _scope_of_run(a) -> Scope:
    """The run's own task package (or --task, where the run came from another machine)."""
    root = runs_dir(a.runs_dir)
    store = RunStore.open(root, a.run_id)
    task = Path(a.task or store.config.task_dir)
    if not task.is_dir():
        raise UserError(f"run {store.config.run_id}: its task package {task} is not here (pass --task DIR)")
    a.run_id = store.config.run_id
    return Scope(tasks=[task], runs_dir=store.path.parent)


def _print(a, fb: Feedback) -> int:
    if a.json:
        print_json(fb.model_dump(mode="json"))
        return 0 if fb.status.value != "FAILED" else 1
    con = human_console(a)
    for line in fb.read:
        con.print(line, markup=False, highlight=False, soft_wrap=True)
    for s in fb.steps:
        # on the CPU a speedup is the interpreter's and ranks nothing: the line says what was established
        geo = f" {s.geomean_speedup:.3f}x" if s.geomean_speedup and fb.timed else ""
        what = s.status.value if s.status else s.outcome.value
        if s.status is not None and s.status.ok and not fb.timed:
            what = "PASSED (correct on the cases run)"
        elif s.status is None or s.outcome.value != s.status.value:
            what = f"{s.outcome.value} {s.status.value if s.status else ''}".strip()
        src = f" (from step {s.parent})" if s.parent is not None else ""
        con.print(plain(f"step {s.index}{src}: {what}{geo}  {s.idea}", markup=False), markup=False, soft_wrap=True)
        if s.reason and (s.status is None or not s.status.ok):
            con.print(f"  {first_line(s.reason, 200)}", markup=False)
        if s.retime_note:
            con.print(f"  {s.retime_note}", markup=False)
    if fb.timed:
        best = f"best step {fb.best_step}, {fb.best_geomean_speedup:.3f}x" if fb.best_geomean_speedup else "no best"
        con.print(f"run {fb.run_id}: {fb.status.value} ({best})", markup=False)
    else:
        passed = ", ".join(map(str, fb.passing)) or "none"
        con.print(f"run {fb.run_id}: {fb.status.value}; kernels that passed: step {passed}. A CPU run checks "
                  f"correctness only: rank them with `optagent retime {fb.run_id}` on a GPU.", markup=False,
                  soft_wrap=True)
    con.rule("what a planner would be shown next")
    # soft_wrap: no line breaks of the console's own, which split a markdown table's rows when the output is a file
    con.print(fb.next_prompt, markup=False, highlight=False, soft_wrap=True)
    return 0 if fb.status.value != "FAILED" else 1


def _file_and_parent(arg: str) -> tuple[Path, Optional[int]]:
    """FILE or FILE@STEP (the step the file's SEARCH/REPLACE blocks apply to and it derives from)."""
    name, at, step = arg.rpartition("@")
    if at and step.isdigit() and not Path(arg).is_file():
        return Path(name), int(step)
    return Path(arg), None


def _read_sources(files: list[Path]) -> list[str]:
    out = []
    for p in files:
        if not p.is_file():
            raise UserError(f"{p}: no such kernel file")
        try:
            out.append(p.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError:
            raise UserError(f"{p}: not a kernel source (not UTF-8 text)") from None
    return out


def cmd_propose(a) -> int:
    from optagent.app.steps import propose

    from optagent.app.steps import check

    named = [_file_and_parent(f) for f in a.files]
    sources = _read_sources([f for f, _ in named])
    parents = [p if p is not None else a.parent for _, p in named]
    labels = [str(f) for f, _ in named]
    ideas = a.idea or None
    if ideas is not None and len(ideas) == 1 and len(sources) > 1:
        ideas = ideas * len(sources)
    try:
        if a.check:
            lines = check(_scope_of_run(a), a.run_id, sources, parents, labels)
            con = human_console(a)
            for line in lines:
                con.print(line, markup=False, highlight=False, soft_wrap=True)
            return 0 if all("\n  syntax and scan OK" in line for line in lines) else 1
        return _print(a, propose(_scope_of_run(a), a.run_id, sources, ideas, None, parents=parents, labels=labels))
    except OutsideError as e:
        raise UserError(str(e)) from None


def cmd_feedback(a) -> int:
    from optagent.app.steps import feedback

    try:
        return _print(a, feedback(_scope_of_run(a), a.run_id))
    except OutsideError as e:
        raise UserError(str(e)) from None


def add_step_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("propose", help="an outside agent's round: evaluate the files in a run, print the feedback")
    p.add_argument("run_id", help="run id (of a run started with --planner external), a prefix, or its path")
    p.add_argument("files", nargs="+", metavar="FILE[@STEP]",
                   help="one candidate each: the IDEA: line then SEARCH/REPLACE blocks against the parent's kernel, "
                        "or the whole file in a fenced code block, or raw source; @STEP names the file's parent")
    p.add_argument("--idea", action="append", help="what the kernel tries (once per file, in order, or once for all; "
                   "default: the file's IDEA: line)")
    p.add_argument("--parent", type=int, help="the parent of every file without @STEP (default: the kernel the "
                   "feedback names as the one to improve)")
    p.add_argument("--check", action="store_true", help="read, apply and scan the files and check their syntax; "
                   "evaluates nothing and records nothing")
    p.add_argument("--task", help="the task package's directory, where the run was moved from another machine")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json", action="store_true", help="the feedback as JSON on stdout")
    add_runs_dir(p)
    p.set_defaults(fn=cmd_propose)

    f = sub.add_parser("feedback", help="print what a planner would be shown next in a run")
    f.add_argument("run_id")
    f.add_argument("--task", help="as for propose")
    f.add_argument("--quiet", action="store_true")
    f.add_argument("--json", action="store_true")
    add_runs_dir(f)
    f.set_defaults(fn=cmd_feedback)
