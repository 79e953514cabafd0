"""optagent's on-disk cache: measured ceilings, package probes, builds, the host-speed record.

Everything lives under ``OPTAGENT_CACHE`` (default ``~/.cache/optagent``); files are replaced
atomically, so concurrent evaluations never read half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from optagent.settings import settings


# A candidate's compiled kernels in its scratch directory, each folder kept once it passed and lent to the next
# process that evaluates the same source (evaluation/builds.py): Triton's cache (TRITON_CACHE_DIR,
# evaluation/isolation.py) and the CUDA backend's objects with their compiler facts (worker/backends/cuda.py).
TRITON_BUILDS, CUDA_BUILDS = ".triton", ".cuda"


def cache_root() -> Path:
    return settings().cache


def write_json(path: Path, data) -> None:
    """Atomic, also among concurrent writers: each writes a temp file of its own (not one named by
    its pid: judges of a pool in PID namespaces all have the same) and renames it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data))
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
