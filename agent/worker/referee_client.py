"""Worker side of the referee (evaluation/referee.py): the harness's questions between timed calls.

The descriptors come in REFEREE_FD_ENV, read at import, before any candidate code runs. Nothing
here is a defence: code in this process can rewrite it. It only lets an honest harness ask;
a candidate that lies to the referee, or asks out of turn, loses its own verdict (the referee
times its windows by its own clock, and the judge holds its outputs to the digests it told).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from optagent.settings import REFEREE_FD_ENV


def _fds() -> Optional[tuple[int, int]]:
    raw = os.environ.pop(REFEREE_FD_ENV, "")
    parts = raw.split(",")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


_FDS = _fds()


class RefereeGone(RuntimeError):
    """The referee stopped answering: it saw a question the harness never asks."""


def active() -> bool:
    return _FDS is not None


def ask(question: str) -> list[str]:
    """One question, one answer line (split on spaces)."""
    assert _FDS is not None
    answers, questions = _FDS
    os.write(questions, question.encode("ascii") + b"\n")
    line = b""
    while not line.endswith(b"\n"):  # one answer a question: a read takes the whole line, never the next
        chunk = os.read(answers, 256)
        if not chunk:
            raise RefereeGone("the referee stopped answering the harness")
        line += chunk
    return line.decode("ascii").split()


def fds() -> Optional[tuple[int, int]]:
    """(answers, questions): for the native timer, which marks each timed call itself (worker/native/timer.c)."""
    return _FDS


def mark(kind: str) -> None:
    """A timed call's bracket, ``T`` just before it and ``D`` just after its sync (the Python timer's; a no-op
    without a referee)."""
    if _FDS is not None:
        ask(kind)


@contextlib.contextmanager
def timed_loop(label: str, baseline: bool, n_sets: int, n_keep: int) -> Iterator[None]:
    """A timed loop opened and closed with the referee (a no-op without one)."""
    if _FDS is None:
        yield
        return
    ask(f"B {label} {'baseline' if baseline else 'eager'} {n_sets} {n_keep}")
    yield
    ask("E")
