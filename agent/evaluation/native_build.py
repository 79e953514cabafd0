"""The native timer's build, by the trusted parent, before any candidate process starts.

worker/native/timer.c is compiled with this machine's C compiler (sysconfig's CC, or CC from
the environment) into the cache, cache_root()/native/<sha of the source and Python version>/.
The parent rebuilds it once per process and checks the .so's sha256 before every evaluation
(a candidate running as the same user, under isolation none, could replace the file); the
worker checks the same sha256 before it loads it. Without a compiler or Python's headers the
evaluation falls back to the Python timer, and the verdict says so (EvalResult.timer).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable, Optional

from optagent.cache import cache_root
from optagent.messages import NativeTimerSpec
from optagent.native_copy import NotTheBuild, checked_copy
from optagent.settings import settings

SOURCE = Path(__file__).resolve().parents[1] / "worker" / "native" / "timer.c"
INCLUDED = (SOURCE.with_name("digest_ptx.h"),)  # what timer.c includes of its own: a change to it is a new build
MODULE = "_optagent_timer"
_built: dict[Path, str] = {}  # .so -> the sha256 this process built it with
# A pool's threads ask at once; one builds, the others wait for it and check its file.
_lock = threading.Lock()


class NativeBuildError(RuntimeError):
    """Why the native timer could not be built (one line)."""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _target(root: Path) -> Path:
    """One file per parent process: another optagent's rebuild never replaces a file whose sha256
    this process has handed to a worker (the worker loads a copy, so the name is free)."""
    key = hashlib.sha256(b"".join(p.read_bytes() for p in (SOURCE, *INCLUDED)) + sys.version.encode()).hexdigest()[:24]
    return root / "native" / key / str(os.getpid()) / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def build(root: Optional[Path] = None) -> NativeTimerSpec:
    """Compile timer.c into the cache (a fresh build, renamed into place); NativeBuildError on failure."""
    so = _target(root or cache_root())
    so.parent.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise NativeBuildError(f"no Python headers at {include}")
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    tmp = so.with_name(f".{so.name}.{os.getpid()}.tmp")
    cmd = [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(tmp), "-ldl"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"{cc[0]}: {e}") from None
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise NativeBuildError(f"{cc[0]} failed on {SOURCE.name}: {last[:200]}")
    os.replace(tmp, so)
    _built[so] = _sha(so)
    return NativeTimerSpec(path=str(so), sha256=_built[so])


def native_timer(root: Optional[Path] = None) -> Optional[NativeTimerSpec]:
    """The checked native timer for the next evaluation, or None (the Python timer) where it cannot be built."""
    if settings().timer == "python":  # never build: the in-process Python timer
        return None
    so = _target(root or cache_root())
    with _lock:
        try:
            if so in _built and so.is_file() and _sha(so) == _built[so]:
                return NativeTimerSpec(path=str(so), sha256=_built[so])
            return build(root)  # first use in this process, or the file changed: build it again
        except (NativeBuildError, OSError):
            return None


_clock: dict[str, Callable[[int, int, int, int, float], int]] = {}


def referee_clock(root: Optional[Path] = None) -> Optional[Callable[[int, int, int, int, float], int]]:
    """timer.c's optagent_referee_clock, loaded into this (the trusted) process from a private copy of the
    checked build (as the worker loads it: a file a candidate could write is read once and hashed), or None
    where the native timer cannot be built (the referee then keeps its clock in its Python thread)."""
    spec = native_timer(root)
    if spec is None:
        return None
    with _lock:
        if spec.sha256 not in _clock:
            try:
                with checked_copy(spec.path, spec.sha256, "optagent_referee_clock") as copy:
                    if copy is None:
                        return None
                    fn = ctypes.CDLL(copy).optagent_referee_clock  # dlopen maps it: the memory file may go
            except (OSError, AttributeError, NotTheBuild):
                return None
            fn.argtypes, fn.restype = [ctypes.c_int] * 4 + [ctypes.c_double], ctypes.c_int  # ..., spin_s
            _clock[spec.sha256] = fn
        return _clock[spec.sha256]
