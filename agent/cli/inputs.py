"""Numbers from the command line: each option checked where it enters, so a bad value is one
line naming the option (exit 2), not a traceback (OPTAGENT_* variables: settings.py)."""

from __future__ import annotations

import argparse
import math
from typing import Callable, NamedTuple, NoReturn, Optional


class _Spec(NamedTuple):
    what: str  # "must be ..."
    integer: bool = False
    minimum: float = 0.0
    above: bool = False  # strictly above minimum


def _parse(text: str, spec: _Spec) -> Optional[float]:
    """The value, or None when it breaks the spec."""
    try:
        value = int(text) if spec.integer else float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < spec.minimum or (spec.above and value == spec.minimum):
        return None
    return value


def number(what: str, integer: bool = False, minimum: float = 0.0, above: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` that refuses values outside the range with 'must be WHAT, got X'."""
    spec = _Spec(what, integer, minimum, above)

    def parse(text: str) -> float:
        value = _parse(text, spec)
        if value is None:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


SECONDS = number("a positive number of seconds", above=True)
NON_NEGATIVE = number("a number >= 0")
STEPS = number("a whole number of steps >= 0", integer=True)
PATIENCE = number("a whole number of steps >= 1", integer=True, minimum=1)
WIDTH = number("a whole number of candidates >= 1", integer=True, minimum=1)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad option as one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"optagent: error: {message.removeprefix('argument ')}\n")
