"""The `optagent mcp` command: the MCP adapter registers it on the program's parser (optagent/__main__.py
puts the CLI's commands and this one together; cli/ and outside/ never import each other)."""

from __future__ import annotations

import argparse
from pathlib import Path

from optagent.app.build import resolve_device
from optagent.app.operations import Scope
from optagent.runs.store import runs_dir
from optagent.settings import UserError


def cmd_mcp(a) -> int:
    try:
        from optagent.outside.mcp_server import serve
    except ImportError as e:
        raise UserError(f"optagent mcp needs the MCP SDK: pip install 'optagent[mcp]' ({e})") from None
    tasks = [Path(t) for t in a.task] or sorted(p.parent for p in Path("tasks").glob("*/xpuoj_problem"))
    if not tasks:
        raise UserError("optagent mcp: no task package to offer (pass --task DIR, once per package)")
    for t in tasks:
        if not t.is_dir():
            raise UserError(f"--task {t}: no such directory")
    scope = Scope(tasks=[t.resolve() for t in tasks], runs_dir=runs_dir(a.runs_dir).resolve(),
                  device=resolve_device(a.device) if a.device else None)
    serve(scope)
    return 0


def add_mcp_command(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("mcp", help="serve optagent's tools to an outside agent over MCP (stdio)")
    m.add_argument("--task", action="append", default=[], help="a task package to offer (repeatable; "
                   "default: every package under ./tasks)")
    m.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible, else cpu")
    m.add_argument("--runs-dir", help="where runs live (default ./runs or OPTAGENT_RUNS_DIR)")
    m.set_defaults(fn=cmd_mcp)
