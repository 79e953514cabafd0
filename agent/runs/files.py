"""The one reader and the one writer of a run's files.

Every file is written atomically (temp file, fsync, rename), so SIGKILL at any
moment leaves each file either old or new, never half-written. Every record is
read through ``read_record``: a file damaged anyway (a full disk, a hand edit, a
copy cut short) is a one-line RunError naming it, never a traceback.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError


M = TypeVar("M", bound=BaseModel)
TMP_SUFFIX = ".tmp"  # atomic_write's temp files: .<name>.<pid>.tmp beside the file


class RunError(Exception):
    """A run that cannot be opened or driven; the message is one line."""


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_text(path: Path) -> str:
    """A run's text file, or a RunError naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunError(f"{path}: missing") from None
    except OSError as e:
        raise RunError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(f"{path}: not UTF-8 text (bad byte at offset {e.start}; damaged?)") from None


def read_record(path: Path, model: type[M]) -> M:
    """The one reader of a run's JSON records: damage becomes a one-line RunError naming the file."""
    text = read_text(path)
    if not text.strip():
        raise RunError(f"{path}: empty file (truncated?)")
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            why = str(first.get("ctx", {}).get("error") or first["msg"])
            hint = " (truncated?)" if "EOF" in why else ""
            raise RunError(f"{path}: not valid JSON{hint}: {_short(why)}") from None
        where = ".".join(str(x) for x in first["loc"])
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise RunError(f"{path}: not a valid {model.__name__} record: "
                       f"{where + ': ' if where else ''}{_short(first['msg'])}{more}") from None


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temp behind (a kill -9 may: see leftovers)
        if isinstance(e, OSError):  # one line naming the file, as the CLI prints it; what was committed stays
            raise RunError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    except OSError as e:
        raise RunError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)


def unified_diff(a: str, b: str, a_name: str = "starter", b_name: str = "best") -> str:
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        fromfile=a_name, tofile=b_name))
