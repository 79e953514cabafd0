"""Bounds on what one worker process may take: host memory, processes and threads, output.

Enforced from outside, by the parent: every TICK it sums the resident anonymous and shared
memory and the threads of the worker's process tree, and stops the worker over a limit
(its output: evaluation/log_tap.py). On CPU the worker also sets RLIMIT_DATA on itself
(worker/limits.py), so an allocation past the limit fails at once; on a GPU it does not
(CUDA maps large private ranges), and the memory limit there is a generous one. In a user
namespace it sets RLIMIT_NPROC too, which the kernel counts per namespace (except for root).
A limit hit is a RUNTIME_ERROR whose reason names the limit.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from optagent.evaluation.log_tap import LogTap
from optagent.schema import Isolation
from optagent.settings import RLIMITS_ENV, settings

OUTPUT_BYTES = 64 << 20
TASKS = 4096  # processes and threads of one worker (the kernel's count: /proc/<pid>/status Threads)
DISK_BYTES = {"cpu": 2 << 30, "cuda": 8 << 30}  # its scratch directory on disk
DISK_ENTRIES = 20000  # files and directories in it: a walk past this many is itself over the limit
CPU_CORES_S = 1.5  # RLIMIT_CPU: the timeout's seconds on every core, and half again
TICK = 0.5  # seconds between looks at the worker's tree (a scan of /proc)
# How an allocation refused by RLIMIT_DATA surfaces in Python and in PyTorch.
ALLOCATION_FAILED = re.compile(r"MemoryError|can't allocate memory|Cannot allocate memory|std::bad_alloc")


@dataclass(frozen=True)
class Limits:
    memory_bytes: Optional[int]
    tasks: int = TASKS
    output_bytes: int = OUTPUT_BYTES
    disk_bytes: Optional[int] = None

    @property
    def memory_gib(self) -> Optional[float]:
        return round(self.memory_bytes / 2**30, 2) if self.memory_bytes else None


def meminfo_bytes(field: str) -> Optional[int]:
    """A /proc/meminfo figure in bytes (None where it says nothing of it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mem_total() -> int:
    return meminfo_bytes("MemTotal") or 16 << 30


def limits_for(device: str) -> Limits:
    """The memory_limit_gib setting (0: none), else 8 GiB on CPU (half the memory if less); on a GPU,
    where host memory holds inputs and outputs of big cases too, half the memory, at least 16 GiB."""
    gib = settings().memory_limit_gib
    if gib is None:
        half = _mem_total() / 2 / 2**30
        gib = min(8.0, half) if device == "cpu" else max(16.0, half)
    return Limits(memory_bytes=int(gib * 2**30) if gib > 0 else None, disk_bytes=DISK_BYTES.get(str(device)))


def record(iso: Isolation, limits: Limits) -> Isolation:
    return iso.model_copy(update={"memory_gib": limits.memory_gib, "tasks": limits.tasks,
                                  "output_mib": limits.output_bytes >> 20})


def rlimits(limits: Limits, device: str, user_ns: bool, timeout_s: Optional[float] = None) -> dict[str, str]:
    """The environment entry that tells the worker which rlimits to set on itself. RLIMIT_CPU bounds its
    processor time (every thread, all cores) by the wall-clock timeout's worth of every core, and half
    again: a backstop that the kernel enforces (SIGKILL) even where the parent's watch is late."""
    items = []
    if timeout_s:
        items.append(f"CPU={int(timeout_s * (os.cpu_count() or 1) * CPU_CORES_S) + 10}")
    if device == "cpu" and limits.memory_bytes:
        items.append(f"DATA={limits.memory_bytes}")
    if user_ns:  # outside a user namespace RLIMIT_NPROC counts all of the user's processes
        items.append(f"NPROC={limits.tasks}")
    return {RLIMITS_ENV: ",".join(items)} if items else {}


def over_memory(text: str, iso: Isolation, device: str) -> Optional[str]:
    """The reason for an allocation that RLIMIT_DATA refused the candidate (on CPU only), or None."""
    if device == "cpu" and iso.memory_gib and ALLOCATION_FAILED.search(text):
        return f"the candidate process exceeded the {iso.memory_gib:g} GiB memory limit ({text.strip()[:300]})"
    return None


def _read(path: str) -> bytes:
    # os.open/os.read, not pathlib: a scan of /proc reads hundreds of files every tick
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def tree_pids(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(_read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split(None, 2)[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(children.get(pid, ()))
    return seen


def tree_usage(root: int) -> tuple[int, int, list[int]]:
    """(resident anonymous + shared bytes, threads, pids) of `root` and every process below it."""
    memory, threads, seen = 0, 0, tree_pids(root)
    for pid in seen:
        try:
            for line in _read(f"/proc/{pid}/status").splitlines():
                key, _, value = line.partition(b":")
                if key in (b"RssAnon", b"RssShmem"):
                    memory += int(value.split()[0]) * 1024
                elif key == b"Threads":
                    threads += int(value)
        except (OSError, ValueError, IndexError):
            continue
    return memory, threads, seen


PRIVATE_MOUNTS = ("/tmp", "/dev/shm")  # where a sandbox puts its own tmpfs


def mounts(mountinfo: bytes) -> list[tuple[int, str, str]]:
    """(device, mount point, file system type) of each line of a /proc/<pid>/mountinfo, in mount order."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        try:
            sep = fields.index(b"-")
            major, minor = fields[2].split(b":")
            out.append((os.makedev(int(major), int(minor)), fields[4].decode(errors="replace"),
                        fields[sep + 1].decode(errors="replace")))
        except (ValueError, IndexError):
            continue
    return out


def private_tmpfs(mountinfo: bytes, host: set[int]) -> dict[str, int]:
    """{mount point: device} of the tmpfs on top at each of PRIVATE_MOUNTS that the host does not mount:
    only a tmpfs is memory; any other file system there (a disk bound in, seen mid-setup) is not."""
    top = {point: (dev, kind) for dev, point, kind in mounts(mountinfo) if point in PRIVATE_MOUNTS}
    return {point: dev for point, (dev, kind) in top.items() if kind == "tmpfs" and dev not in host}


def _read_all(path: str) -> bytes:
    with open(path, "rb") as f:  # mountinfo can pass 4 KiB (_read's one read)
        return f.read()


def private_tmpfs_bytes(pids: list[int], look: int = 4) -> int:
    """Bytes held in the private /tmp and /dev/shm of the sandbox these processes run in (bwrap's tmpfs:
    memory that no process's resident set shows), seen through /proc/<pid>/root; 0 without one.
    The host's devices are every one its own mount table names, stacked mounts included."""
    try:
        host = {dev for dev, _, _ in mounts(_read_all("/proc/self/mountinfo"))}
    except OSError:
        return 0
    found: dict[int, int] = {}
    for pid in pids[:look]:  # the first few: every process of the tree shares them
        try:
            private = private_tmpfs(_read_all(f"/proc/{pid}/mountinfo"), host)
        except OSError:
            continue
        for point, dev in private.items():
            used = None if dev in found else used_on(f"/proc/{pid}/root{point}", dev)
            if used is not None:
                found[dev] = used
    return sum(found.values())


def used_on(path: str, dev: int) -> Optional[int]:
    """Bytes used on the file system of the directory at `path` if it is device `dev`, else None. One open,
    both looks at it: a sandbox being set up pivots its root, so two lookups of one /proc/<pid>/root path can
    land on two mounts (CI read a disk's used 24.2 GiB, past a stat that had seen the tmpfs, as 'resident')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_dev != dev:
            return None
        st = os.fstatvfs(fd)
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    finally:
        os.close(fd)


def disk_usage(top: Path, limit: int = DISK_ENTRIES) -> tuple[int, int]:
    """(bytes, entries) under `top`, no link followed; the walk stops after `limit` entries."""
    total, entries, todo = 0, 0, [str(top)]
    while todo and entries <= limit:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    entries += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
        except OSError:
            continue
    return total, entries


class Watch:
    """Looks at a running worker; check() says which limit it broke, once it has."""

    def __init__(self, pid: int, limits: Limits, tap: LogTap, who: str, scratch: Optional[Path] = None,
                 disk_now: bool = True):
        """The disk limit counts what the worker adds to its scratch directory (a judge shares its candidate's);
        disk_now=False: nothing until count_disk() (a warm judge, waiting while its candidate writes there)."""
        self.pid, self.limits, self.tap, self.who, self.scratch = pid, limits, tap, who, scratch
        self.peak_bytes = 0
        self._next = 0.0
        self._disk_base: Optional[tuple[int, int]] = None
        if disk_now:
            self.count_disk()

    def count_disk(self) -> None:
        if self.limits.disk_bytes and self.scratch is not None:
            self._disk_base = disk_usage(self.scratch)

    def check(self) -> Optional[str]:
        if self.tap.over.is_set():
            return f"the {self.who} process wrote over {self.limits.output_bytes >> 20} MiB of output (cut there)"
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + TICK
        memory, threads, pids = tree_usage(self.pid)
        memory += private_tmpfs_bytes(pids)  # files in a private tmpfs are memory too
        self.peak_bytes = max(self.peak_bytes, memory)
        if self.limits.memory_bytes and memory > self.limits.memory_bytes:
            return (f"the {self.who} process exceeded the {self.limits.memory_gib:g} GiB memory limit "
                    f"({memory / 2**30:.1f} GiB resident)")
        if threads > self.limits.tasks:
            return f"the {self.who} process exceeded the limit of {self.limits.tasks} processes and threads"
        if self.limits.disk_bytes and self.scratch is not None and self._disk_base is not None:
            used, entries = disk_usage(self.scratch)
            used, entries = used - self._disk_base[0], entries - self._disk_base[1]
            if used > self.limits.disk_bytes or entries > DISK_ENTRIES:
                return (f"the {self.who} process exceeded the {self.limits.disk_bytes >> 20} MiB disk limit of its "
                        f"scratch directory ({used >> 20} MiB in {entries} entries; at most {DISK_ENTRIES})")
        return None

    def wait(self, proc: subprocess.Popen, seconds: float) -> Optional[str]:
        """proc.wait(seconds), watching; the limit broken meanwhile, if any (TimeoutExpired after seconds)."""
        end = time.monotonic() + seconds
        while True:
            try:
                proc.wait(timeout=max(0.0, min(TICK, end - time.monotonic())))
                return None
            except subprocess.TimeoutExpired:
                if time.monotonic() >= end:
                    raise
            why = self.check()
            if why:
                return why
