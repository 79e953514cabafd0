"""A candidate's own compiled kernels (its Triton cache, its CUDA object), kept by its source's sha256 for its
next evaluation.

Each evaluation compiles in a cache of its own (isolation.worker_env): no kernel leaves a binary for another
to load. A kernel evaluated again (a re-time beside a new candidate, an evaluation run again alone) would
compile the same source again: 1-2 s of a re-time's 15 on the H200, paid by both kernels. So once a
candidate passed, the parent copies what its cache holds into a store no candidate writes (under the scratch
base, which bubblewrap hides; Landlock lets a candidate read it), under its source's sha256, and hands a copy
to the next process that evaluates the same source, before any candidate code runs there. What the store
holds was written by that candidate's own process, so it goes only to the same source: a kernel can plant
nothing in it for another. A CUDA kernel's object is scanned again and linked by the process it is lent to
(worker/backends/cuda.py): what its process may have rewritten meanwhile passes the same object scan.
The parent copies regular files only (no link is followed, from a directory opened without following one),
at most MAX_BYTES an entry; the store keeps the MOST newest entries. Triton's group files, which name a kernel's
files by absolute path, are pointed at the lent copies (repoint_groups): without it no lent Triton kernel was found.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Optional

from optagent.cache import CUDA_BUILDS, TRITON_BUILDS
from optagent.evaluation.safe_files import open_dir, open_regular

MAX_BYTES = 256 << 20
MOST = 32
GROUP_PREFIX = "__grp__"  # Triton's group files: the files of one compiled kernel (repoint_groups)
MAX_GROUP_BYTES = 1 << 16


class Builds:
    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def keep(self, sha: str, scratch_fd: Optional[int]) -> None:
        """Copy the build folders of the scratch directory (its descriptor, opened before any candidate ran) under
        sha, one folder of the entry each."""
        if scratch_fd is None or not _is_sha(sha):
            return
        tmp = self.root / f".new-{sha}-{threading.get_ident()}"
        budget, kept = [MAX_BYTES], False
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name in (TRITON_BUILDS, CUDA_BUILDS):
                try:
                    src = open_dir(Path(name), scratch_fd)
                except OSError:
                    continue  # nothing compiled there (or not a directory)
                try:
                    (tmp / name).mkdir()
                    _copy_regular(src, tmp / name, budget, depth=3)
                    kept = True
                finally:
                    os.close(src)
            if kept:
                with self._lock:
                    shutil.rmtree(self.root / sha, ignore_errors=True)
                    tmp.rename(self.root / sha)
                    self._trim()
        except OSError:
            pass  # a store that cannot be written only costs the next evaluation its compile
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def lend(self, sha: str, scratch: Path) -> bool:
        """Copy sha's kept cache into a scratch directory no candidate has run in yet; whether one was kept."""
        entry = self.root / sha
        if not _is_sha(sha) or not entry.is_dir():
            return False
        try:
            with self._lock:
                for name in (TRITON_BUILDS, CUDA_BUILDS):
                    if (entry / name).is_dir():
                        shutil.copytree(entry / name, scratch / name, symlinks=True, dirs_exist_ok=True,
                                        copy_function=_copy_new)
                os.utime(entry)  # the newest: trimmed last
            repoint_groups(scratch / TRITON_BUILDS)
            return True
        except OSError:
            return False

    def _trim(self) -> None:
        entries = sorted((p for p in self.root.iterdir() if _is_sha(p.name)), key=lambda p: p.stat().st_mtime)
        for old in entries[:-MOST]:
            shutil.rmtree(old, ignore_errors=True)


def repoint_groups(cache: Path) -> None:
    """Triton finds a cached kernel through its group file (triton/runtime/cache.py put_group), which names each
    file of the group by its absolute path where it was compiled: in the first process's scratch directory, gone (or
    hidden by bubblewrap) when the copy is lent. So no lent Triton kernel was ever found, and each compiled again: a
    re-time of two splitkv_gqa kernels took 9.6 s on an H100 against their evaluations' 2.6 s of timing (docs/gpu.md,
    2026-12-07, fourth session). Each lent group now names the files beside it; one that names anything else (a
    path, a file not in its folder: not Triton's) is dropped, and that kernel compiles as before."""
    for group in cache.glob(f"*/{GROUP_PREFIX}*"):
        try:
            if group.is_symlink() or group.stat().st_size > MAX_GROUP_BYTES:
                raise ValueError(group.name)
            children = json.loads(group.read_text(encoding="utf-8"))["child_paths"]
            here = {name: group.parent / name for name in children}
            if not all(isinstance(old, str) and Path(old).name == name and name not in ("", ".", "..")
                       and path.is_file() and not path.is_symlink() for (name, old), path in
                       zip(children.items(), here.values())):
                raise ValueError(group.name)
            if any(old != str(here[name]) for name, old in children.items()):  # a spare's own group stays as it is
                group.write_text(json.dumps({"child_paths": {name: str(path) for name, path in here.items()}}),
                                 encoding="utf-8")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            group.unlink(missing_ok=True)


def _copy_new(src: str, dst: str) -> None:
    """A file the process there has not made itself: a spare's own (Triton's driver module, loaded while it
    waited) is never written over under it."""
    if not os.path.lexists(dst):
        shutil.copy2(src, dst)


def _is_sha(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _copy_regular(src_fd: int, dst: Path, budget: list[int], depth: int) -> None:
    """Regular files and directories under src_fd into dst, links and devices left out, up to budget[0] bytes."""
    for entry in os.scandir(src_fd):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode) and depth > 0:
            sub = open_dir(Path(entry.name), src_fd)
            try:
                (dst / entry.name).mkdir()
                _copy_regular(sub, dst / entry.name, budget, depth - 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(mode):
            with os.fdopen(open_regular(src_fd, entry.name), "rb") as f:  # UnsafeFile (an OSError): not kept
                size = os.fstat(f.fileno()).st_size
                if size > budget[0]:
                    raise OSError(f"{entry.name}: not kept (over the store's limit)")
                budget[0] -= size
                (dst / entry.name).write_bytes(f.read(size))
