"""What every backend shares: the Backend protocol and the errors a build ends in.

Apart from the package's __init__ so that the backends import these without importing
the module that picks among them (no import cycle)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol


class CompileError(Exception):
    """The candidate does not build; the message is what the user needs to see."""


class Unsupported(Exception):
    """The candidate's language cannot run here; the message says why."""


class Refused(Exception):
    """The candidate builds but does what a kernel may not (object_scan.py): REJECTED."""


class Backend(Protocol):
    def prepare(self, source_path: Path, scratch: Path) -> None: ...

    def load_fresh(self, tag: str) -> Callable: ...
