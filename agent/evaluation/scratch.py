"""Scratch directories of evaluations, and the sweep of a killed evaluation's on the next start."""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Optional

from optagent.settings import settings

# Scratch directories: each eval-* dir holds an flock on its OWNER file for as long as its evaluation lives;
# the kernel drops it when the process dies (kill -9 too), so the next start can tell a killed evaluation's
# leftovers from a directory another optagent process is using right now.
OWNER = ".owner"
_owned: dict[Path, object] = {}
# A descriptor of each scratch directory, opened before any candidate ran in it: the parent's file
# operations there go through it (evaluation/safe_files.py), whatever the path points at later.
_dirs: dict[Path, int] = {}
_swept: set[Path] = set()
STALE_NEW_S = 600  # a half-made directory this old belongs to no one


def scratch_base(root: Optional[Path] = None) -> Path:
    return root or settings().scratch


def new_scratch(root: Optional[Path] = None) -> tuple[Path, str]:
    base = scratch_base(root)
    if base not in _swept:  # once per process and place: the first evaluation of a start
        _swept.add(base)
        sweep_scratch(base)
    nonce = secrets.token_hex(16)
    name = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{nonce[:8]}"
    # Made under a name the sweep ignores and renamed once locked: never seen unlocked.
    tmp = base / f".new-{name}"
    tmp.mkdir(parents=True)
    fh = open(tmp / OWNER, "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    dir_fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    path = base / name
    tmp.rename(path)
    _owned[path] = fh
    _dirs[path] = dir_fd
    return path, nonce


def scratch_fd(path: Path) -> Optional[int]:
    """The descriptor opened when new_scratch made `path` (None for a directory made elsewhere)."""
    return _dirs.get(path)


def _release(path: Path) -> None:
    fd = _dirs.pop(path, None)
    if fd is not None:
        os.close(fd)
    fh = _owned.pop(path, None)
    if fh is not None:
        fh.close()  # closing drops the flock


def keep_scratch(path: Path) -> None:
    """Keep the directory for inspection: no longer owned, and never swept (no OWNER file)."""
    (path / OWNER).unlink(missing_ok=True)
    _release(path)


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _release(path)


def sweep_scratch(base: Path) -> list[Path]:
    """Remove the scratch directories of evaluations whose process died; a live one's lock is held."""
    removed: list[Path] = []
    try:
        dirs = sorted(p for p in base.iterdir() if p.name.startswith(("eval-", ".new-eval-")))
    except OSError:
        return removed
    for d in dirs:
        if not (d / OWNER).is_file():
            # a kept directory (--keep-scratch), or one killed before it was locked: only those are stale
            try:
                stale = d.name.startswith(".new-") and time.time() - d.stat().st_mtime > STALE_NEW_S
            except OSError:
                stale = False
            if stale:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
            continue
        try:
            fh = open(d / OWNER, "r")
        except OSError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: another optagent process is evaluating in it
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed
