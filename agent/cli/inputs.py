"""Numbers from outside: OPTAGENT_* variables and command-line options.

Each is checked where it enters, so a bad value is one line naming the variable
or option (exit 2), not a traceback, and not a failure deep inside a run.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Callable, NamedTuple, NoReturn, Optional


class UserError(Exception):
    """Bad input: printed as one line, exit code 2, no traceback."""


class EnvError(ValueError):
    """A bad OPTAGENT_* value; the message is one line naming the variable."""


class _Spec(NamedTuple):
    what: str  # "must be ..."
    integer: bool = False
    minimum: float = 0.0
    above: bool = False  # strictly above minimum


_PRICE = _Spec("a price in USD per million tokens (a number >= 0)")
NUMERIC_ENV = {
    "OPTAGENT_PRICE_PROMPT": _PRICE,
    "OPTAGENT_PRICE_COMPLETION": _PRICE,
    "OPTAGENT_RETRY_ATTEMPTS": _Spec("a whole number of attempts, at least 1", integer=True, minimum=1),
    "OPTAGENT_RETRY_BASE_S": _Spec("a number of seconds >= 0"),
    "OPTAGENT_MEMORY_LIMIT_GIB": _Spec("a number of GiB >= 0 (0: no memory limit)"),
    "OPTAGENT_CPU_LANES": _Spec("a whole number of timing lanes, at least 1", integer=True, minimum=1),
}


def _parse(text: str, spec: _Spec) -> Optional[float]:
    """The value, or None when it breaks the spec."""
    try:
        value = int(text) if spec.integer else float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < spec.minimum or (spec.above and value == spec.minimum):
        return None
    return value


def env_number(name: str, default: Optional[float] = None) -> Optional[float]:
    """A numeric OPTAGENT_* variable (see NUMERIC_ENV); default when unset or empty."""
    spec = NUMERIC_ENV[name]
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = _parse(raw.strip(), spec)
    if value is None:
        raise EnvError(f"{name}={raw!r}: must be {spec.what}")
    return value


def check_env() -> None:
    """Read every numeric variable once, before a run starts."""
    for name in NUMERIC_ENV:
        env_number(name)


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
