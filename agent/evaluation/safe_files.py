"""File operations the trusted side does where a candidate could write (its scratch directory).

The parent is a deputy with more rights than the candidate: a plain open() of a path in the
scratch directory follows a symlink the candidate planted (to a host file, resolved on the host,
outside any sandbox) and blocks forever on a FIFO. So every such operation goes through here:
relative to a directory descriptor opened before any candidate code ran (a renamed or relinked
directory changes nothing), never following a final symlink (O_NOFOLLOW), never blocking on open
(O_NONBLOCK), and checked to be a regular file (fstat) before a byte is read. What the parent hands
a worker (its job) travels in a memory file (memfd), never through the file system.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional

from optagent.messages import Job, Sample

NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,200}")
EXTRA_SAMPLES = 16  # per case, beyond those the parent asked for: a flood of claimed files is not opened


class UnsafeFile(OSError):
    """A name the trusted side will not open: not a regular file, a link, or not where it was put."""


def open_dir(path: Path, dir_fd: Optional[int] = None) -> int:
    """A descriptor of the directory `path` (relative to dir_fd if given), a symlink refused."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=dir_fd)


def create(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file `name` in the directory, open for writing. Whatever the candidate left under that
    name (a symlink, a FIFO, a file) is unlinked first (unlinking a link touches only the link);
    O_EXCL then fails rather than open anything planted in between."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as e:  # a directory planted under the name
        raise UnsafeFile(f"{name}: cannot be replaced ({e.strerror})") from None
    try:
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as e:
        raise UnsafeFile(f"{name}: {e.strerror} (planted while it was being made)") from None


def open_regular(dir_fd: int, name: str) -> int:
    """`name` in the directory, open for reading, only if it is a regular file (no link, FIFO, device)."""
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        raise UnsafeFile(f"{name}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFile(f"{name}: not a regular file")
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `path` (its directory and itself opened without
    following links); b"" when it is missing or anything but a regular file."""
    try:
        d = open_dir(path.parent)
    except OSError:
        return b""
    try:
        fd = open_regular(d, path.name)
    except OSError:
        return b""
    finally:
        os.close(d)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def job_fd(job: Job) -> int:
    """The job in a memory file the child reads by descriptor: nothing on disk to plant or redirect."""
    fd = os.memfd_create(f"optagent-job-{job.mode}", os.MFD_CLOEXEC)
    data = job.model_dump_json().encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def sample_name(case: str, sample: Sample) -> Optional[str]:
    """The file the harness saves `sample` of `case` under (worker/candidate.py), named by the
    parent from the case label and sample name; never the path the candidate's message claims."""
    name = f"{case}-{sample.name}.pt"
    return name if SAFE_NAME.fullmatch(name) and ".." not in name else None


def open_samples(job: Job, scratch_fd: Optional[int]) -> tuple[Job, list[int]]:
    """The judge's job with each sample opened by the parent (Sample.fd, file = the parent's name),
    and the descriptors to pass and close. A sample that is not a regular file directly in the
    outputs directory keeps fd None: the judge rejects it."""
    fds: list[int] = []
    where, scratch = Path(job.outputs_dir or job.scratch), Path(job.scratch)
    try:  # the outputs directory the parent made in the scratch directory, not whatever is there now
        base = os.dup(scratch_fd) if scratch_fd is not None else open_dir(scratch)
        try:
            outputs = open_dir(Path(where.name), dir_fd=base) if where.parent == scratch \
                else (os.dup(base) if where == scratch else None)
        finally:
            os.close(base)
    except OSError:
        outputs = None
    samples: dict[str, list[Sample]] = {}
    try:
        for case, listed in job.samples.items():
            asked = {e.name for e in job.expected.get(case, [])}
            extra, kept = 0, []
            for s in listed:
                if s.name not in asked:
                    extra += 1
                    if extra > EXTRA_SAMPLES:
                        continue
                name = sample_name(case, s)
                fd = None
                if name is not None and outputs is not None:
                    try:
                        fd = open_regular(outputs, name)
                        fds.append(fd)
                    except OSError:
                        fd = None
                kept.append(s.model_copy(update={"file": name or "", "fd": fd}))
            samples[case] = kept
    finally:
        if outputs is not None:
            os.close(outputs)
    return job.model_copy(update={"samples": samples}), fds
