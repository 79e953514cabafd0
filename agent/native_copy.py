"""The parent's native build, loaded from a private copy: by the worker (the timer) and by the parent (the referee's
clock). The file on disk sits where a candidate running as the same user could write it, so it is read once,
checked against the sha256 the parent recorded when it built it, and loaded from an anonymous memory file
(memfd) holding those bytes, never opened by path again."""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional


class NotTheBuild(RuntimeError):
    """The file is not the build the parent made (its sha256 differs)."""


@contextmanager
def checked_copy(path: str, sha256: str, name: str) -> Iterator[Optional[str]]:
    """A path to a private copy of the file, valid inside the block (the loader maps it, so it may go after);
    None where no memory file can be made. NotTheBuild when the file's sha256 is not `sha256`."""
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise NotTheBuild(f"{path}: not the native timer the parent built (its sha256 differs)")
    fd: Optional[int] = None
    try:
        fd = os.memfd_create(name)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except (AttributeError, OSError):
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield f"/proc/self/fd/{fd}" if fd is not None else None
    finally:
        if fd is not None:
            os.close(fd)
