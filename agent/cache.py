"""optagent's on-disk cache: measured ceilings, package probes, builds, the host-speed record.

Everything lives under ``OPTAGENT_CACHE`` (default ``~/.cache/optagent``); files are replaced
atomically, so concurrent evaluations never read half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("OPTAGENT_CACHE", Path.home() / ".cache" / "optagent"))


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
