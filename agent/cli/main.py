"""``optagent``: the command line; task and eval here, the run commands in runs and browse.

Concrete classes are picked in build.py only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from rich.table import Table

from optagent import __version__
from optagent.schema import Language, Status
from optagent.secret_env import hide_secrets
from optagent.evaluation.cases import CaseListError
# UserError lives in inputs so that `python -m optagent.cli.main` (cli as __main__) catches the same class
from optagent.cli.inputs import OneLineParser
from optagent.settings import ISOLATION_ENV, EnvError, UserError
from optagent.app.evaluate import evaluate
from optagent.cli.browse import add_browse_commands
from optagent.app.build import resolve_device
from optagent.cli.options import add_eval_options
from optagent.cli.runs import add_run_commands
from optagent.cli.step_mode import add_step_commands
from optagent.runs.files import RunError
from optagent.task import TaskError, detect_language, extract_code, load_task
from optagent.cli.views import console, human_console, print_json
from optagent.report.format import print_eval


def _read_kernel(path: Path, language: Optional[str]) -> tuple[str, Language]:
    if not path.is_file():
        raise UserError(f"{path}: no such kernel file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a kernel source (a binary file: not UTF-8 text)") from None
    if "\0" in text:
        raise UserError(f"{path}: not a kernel source (a binary file: it holds NUL bytes)")
    if path.suffix.lower() == ".md":
        text = extract_code(text) or text
    lang = Language(language) if language else detect_language(text)
    if lang is None:
        raise UserError(f"{path}: cannot tell the kernel's language (use --language)")
    return text, lang


def cmd_task_validate(a) -> int:
    from optagent.evaluation.evaluator import probe_task

    task = load_task(a.dir)
    if task.strategies_dir:  # text only: a bad strategy.toml is a one-line TaskError before the probe's seconds
        from optagent.search.strategy_spec import read_spec

        read_spec(task.strategies_dir)
    found = probe_task(task)
    con = human_console(a)
    if a.json:
        print_json({"task": task.name, "dir": str(task.root), "title": task.title,
                    "languages": [lang.value for lang in task.languages], "cases": len(found.cases),
                    "outputs": found.outputs, "inouts": found.inouts, "smoke": len(task.manifest.smoke) if task.manifest else 0,
                    "hidden": len(task.manifest.hidden) if task.manifest else 0,
                    "baseline_label": found.baseline_label})
    langs = ", ".join(lang.value for lang in task.languages) or "none"
    con.print(f"[green]ok[/] {task.root}: {task.title!r}, {len(found.cases)} cases, languages {langs}, "
              f"outputs {found.outputs}{f', in/out {found.inouts}' if found.inouts else ''}, {len(task.manifest.smoke) if task.manifest else 0} smoke / "
              f"{len(task.manifest.hidden) if task.manifest else 0} hidden cases; baseline: {found.baseline_label}")
    return 0


def cmd_task_show(a) -> int:
    from optagent.evaluation.evaluator import probe_task

    task = load_task(a.dir)
    con = console()
    con.rule(f"{task.title}  ({task.name})")
    con.print(task.statement, markup=False)
    for lang, contract in task.contracts.items():
        con.rule(f"contract: {lang.value}")
        con.print(contract, markup=False)
    found = probe_task(task)
    t = Table(title="cases", title_justify="left")
    for col in ("case", "sizes", "warmup", "iters"):
        t.add_column(col)
    for row in found.cases:
        t.add_row(str(row.index), " ".join("x".join(map(str, s)) for s in row.sizes), str(row.warmup), str(row.iters))
    con.print(t)
    for extra in found.extra:
        con.print(f"  {extra.label}: {extra.sizes}", markup=False)
    con.print("starters: " + ", ".join(f"{s.path.name} ({s.language.value})" for s in task.starters))
    con.print("reference CSVs: " + (", ".join(str(c.relative_to(task.root)) for c in task.csvs) or "none"))
    con.print(f"baseline: {found.baseline_label}")
    return 0


def cmd_eval(a) -> int:
    task = load_task(a.dir)
    source, lang = _read_kernel(Path(a.kernel), a.language)
    from optagent.cli.live import LiveProgress

    live = None if a.quiet else LiveProgress(console(stderr=True))
    try:
        result = evaluate(task, source, lang, resolve_device(a.device), a.cases, hidden=not a.no_hidden,
                          timeout_s=a.timeout, compiler=a.compiler, keep_scratch=a.keep_scratch, profile=a.profile,
                          progress=live, notice=lambda line: human_console(a).print(line, markup=False, soft_wrap=True))
    finally:
        if live is not None:
            live.close()
    if a.json_out:
        out = Path(a.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.model_dump(mode="json"), indent=2))
    if a.json:
        print_json(result.model_dump(mode="json"))
    print_eval(human_console(a), result)
    return 0 if result.status is Status.PASSED else 1


def build_parser(extra: Sequence[Callable[[argparse._SubParsersAction], None]] = ()) -> argparse.ArgumentParser:
    """Every command of the CLI; extra: other adapters' commands (optagent/__main__.py adds `mcp`)."""
    p = OneLineParser(prog="optagent", description="Make a contest kernel fast, with an LLM in the loop.")
    p.add_argument("--version", action="version", version=f"optagent {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    task = sub.add_parser("task", help="inspect and validate task packages")
    tsub = task.add_subparsers(dest="task_command", required=True, metavar="SUBCOMMAND")
    v = tsub.add_parser("validate", help="exit 0 when a task package is usable, else name what is wrong")
    v.add_argument("dir")
    v.add_argument("--quiet", action="store_true")
    v.add_argument("--json", action="store_true", help="print what was found as JSON on stdout")
    v.set_defaults(fn=cmd_task_validate)
    s = tsub.add_parser("show", help="title, statement, contracts, cases, starters, reference CSVs")
    s.add_argument("dir")
    s.set_defaults(fn=cmd_task_show)

    e = sub.add_parser("eval", help="compile, check and time one kernel in the sandbox")
    e.add_argument("dir", help="task package directory")
    e.add_argument("kernel", help="kernel source file (Triton .py, CUDA .cu, TileLang .py, or Markdown)")
    add_eval_options(e)
    e.add_argument("--json", action="store_true", help="print the validated result as JSON on stdout "
                   "(the table goes to stderr)")
    e.add_argument("--json-out", metavar="FILE", help="write the validated result as JSON to FILE")
    e.add_argument("--quiet", action="store_true", help="print nothing but --json; use the exit code")
    e.add_argument("--keep-scratch", action="store_true", help="keep the sandbox's scratch directory")
    e.set_defaults(fn=cmd_eval)

    add_run_commands(sub)
    add_step_commands(sub)
    add_browse_commands(sub)
    from optagent.cli.retime import add_retime_command

    add_retime_command(sub)
    from optagent.cli.report import add_report_commands

    add_report_commands(sub)
    for add in extra:
        add(sub)
    return p


def main(argv: Optional[list[str]] = None,
         extra: Sequence[Callable[[argparse._SubParsersAction], None]] = ()) -> int:
    if argv is None:  # the real command line, not a caller's: keys out of /proc/<pid>/environ (re-executes)
        hide_secrets()
    parser = build_parser(extra)
    a = parser.parse_args(argv)
    if getattr(a, "isolation", None):  # read where the sandbox is chosen (evaluation/isolation.py)
        os.environ[ISOLATION_ENV] = a.isolation
    err = console(stderr=True)
    try:
        return int(a.fn(a) or 0)
    except (TaskError, UserError, RunError, CaseListError, EnvError) as e:
        err.print(f"optagent: error: {e}", markup=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("optagent: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
