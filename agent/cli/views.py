"""Terminal output: rich consoles, colour off when not a TTY or with NO_COLOR; a command's JSON document."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console

def console(stderr: bool = False, quiet: bool = False) -> Console:
    no_color = bool(os.environ.get("NO_COLOR")) or not (sys.stderr if stderr else sys.stdout).isatty()
    # Piped output is 160 wide unless COLUMNS says otherwise (as a terminal's own width does).
    piped = not (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, no_color=no_color, highlight=False, quiet=quiet, soft_wrap=False,
                   width=160 if piped and not os.environ.get("COLUMNS", "").isdigit() else None)


def human_console(a) -> Console:
    """A command's human output: stdout, or stderr under --json, where stdout holds only the JSON document."""
    return console(stderr=bool(getattr(a, "json", False)), quiet=bool(getattr(a, "quiet", False)))


def print_json(doc) -> None:
    """A command's --json document: the one thing it writes on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()
