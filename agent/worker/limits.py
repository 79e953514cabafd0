"""The rlimits a worker sets on itself before any candidate code exists in the process.

The parent names them in OPTAGENT_RLIMITS (evaluation/limits.py says which, and why only
those); soft and hard limit alike, so nothing the process runs later can raise them again.
"""

from __future__ import annotations

import os
import resource

from optagent.settings import RLIMITS_ENV

NAMES = {"DATA": resource.RLIMIT_DATA, "NPROC": resource.RLIMIT_NPROC, "CPU": resource.RLIMIT_CPU}


def apply_rlimits() -> None:
    for item in filter(None, os.environ.pop(RLIMITS_ENV, "").split(",")):
        name, _, value = item.partition("=")
        resource.setrlimit(NAMES[name], (int(value), int(value)))
