"""Bounds on what one worker may take besides memory, tasks and output: the disk of its scratch
directory (bytes and entries), its private tmpfs counted as memory, and processor time (RLIMIT_CPU)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from optagent.evaluation import isolation
from optagent.evaluation.limits import DISK_ENTRIES, Limits, Watch, private_tmpfs, private_tmpfs_bytes, rlimits, used_on
from optagent.settings import RLIMITS_ENV

NO_OUTPUT = SimpleNamespace(over=SimpleNamespace(is_set=lambda: False))


def watched(argv: list[str], limits: Limits, scratch=None, seconds: float = 30) -> str:
    proc = subprocess.Popen(argv, cwd=scratch)
    try:
        watch = Watch(proc.pid, limits, NO_OUTPUT, "candidate", scratch)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            why = watch.check()
            if why:
                return why
            time.sleep(0.05)
        return ""
    finally:
        proc.kill()
        proc.wait()


def test_the_scratch_directory_is_bounded_in_bytes(tmp_path):
    code = "import time\nwith open('big', 'wb') as f:\n    f.write(b'x' * (40 << 20))\n    f.flush()\ntime.sleep(30)"
    why = watched([sys.executable, "-c", code], Limits(memory_bytes=None, disk_bytes=16 << 20), tmp_path)
    assert re.search(r"exceeded the 16 MiB disk limit of its scratch directory \(\d+ MiB", why), why


def test_the_scratch_directory_is_bounded_in_entries(tmp_path):
    code = (f"import os, time\nos.mkdir('d')\n[open(f'd/{{i}}', 'w').close() for i in range({DISK_ENTRIES + 500})]\n"
            "time.sleep(30)")
    why = watched([sys.executable, "-c", code], Limits(memory_bytes=None, disk_bytes=1 << 30), tmp_path, 60)
    assert f"at most {DISK_ENTRIES}" in why, why


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
def test_files_in_the_private_tmpfs_count_as_memory(tmp_path):
    # written by head in small blocks: the process's own resident set stays far below the limit. The shell,
    # not this interpreter: a venv under /tmp (CI's) is hidden by the private /tmp this test mounts
    fill = f"head -c {300 << 20} /dev/zero > /tmp/fill; sleep 30"
    argv = [shutil.which("bwrap"), *isolation.BWRAP_NS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", str(1 << 30), "--tmpfs", "/tmp", "--", "/bin/sh", "-c", fill]
    why = watched(argv, Limits(memory_bytes=200 << 20))
    assert re.search(r"exceeded the 0\.2 GiB memory limit \(0\.[2-4] GiB resident\)", why), why


# A sandbox's mount table as /proc/<pid>/mountinfo gives it: the root bound in, a disk at /data, and at
# /tmp first a bind of that disk (as seen mid-setup), then a tmpfs stacked on it.
MOUNTINFO = b"""\
100 90 254:0 / / ro,relatime - ext4 /dev/vda rw
101 100 0:40 / /dev rw,nosuid - tmpfs tmpfs rw,mode=755
102 101 0:41 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw,size=1048576k
103 100 259:3 / /data ro,relatime - ext4 /dev/vdb rw
104 100 259:3 /scratch /tmp rw,relatime - ext4 /dev/vdb rw
105 104 0:42 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw,size=1048576k
"""


def test_only_a_private_tmpfs_on_top_is_counted_as_memory():
    host = {os.makedev(254, 0), os.makedev(0, 41)}  # the host mounts the root disk and that /dev/shm itself
    assert private_tmpfs(MOUNTINFO, host) == {"/tmp": os.makedev(0, 42)}
    # a disk at /tmp (a CI machine's 32 GiB of used disk once read as resident memory) is never memory
    disk_on_top = MOUNTINFO.replace(b"105 104 0:42 / /tmp rw,nosuid,nodev - tmpfs tmpfs", b"105 104 0:42 / /other x - tmpfs tmpfs")
    assert private_tmpfs(disk_on_top, host) == {}



def test_a_path_that_changes_mounts_between_two_looks_is_measured_where_it_was_checked(tmp_path, monkeypatch):
    """A sandbox being set up pivots its root: /proc/<pid>/root/tmp named a tmpfs when it was checked and the
    host's disk a moment later, and CI read the disk's used bytes as 24.2 GiB resident. Here a link plays that
    path, turned from a tmpfs (/dev/shm) to the disk right after the first look at it."""
    shm, disk = Path("/dev/shm"), tmp_path / "disk"
    disk.mkdir()
    d = os.statvfs(disk)
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(disk).st_dev or (d.f_blocks - d.f_bfree) * d.f_frsize < 1 << 30:
        pytest.skip("needs a tmpfs at /dev/shm and over 1 GiB used on another file system")
    link = tmp_path / "root"
    link.symlink_to(shm)
    real_stat, real_fstat = os.stat, os.fstat

    def pivot():
        link.unlink()
        link.symlink_to(disk)

    def stat(path, *a, **k):
        out = real_stat(path, *a, **k)
        if str(path) == str(link) and link.resolve() == shm:
            pivot()
        return out

    def fstat(fd):
        out = real_fstat(fd)
        if link.resolve() == shm:
            pivot()
        return out

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "fstat", fstat)
    used = used_on(str(link), real_stat(shm).st_dev)
    s = os.statvfs(shm)
    assert link.resolve() == disk  # the path changed mounts after the first look
    assert used is not None and abs(used - (s.f_blocks - s.f_bfree) * s.f_frsize) < 256 << 20, used

@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
def test_a_host_tmpfs_bound_in_is_not_the_candidates_memory(tmp_path):
    """The host's own /dev/shm (with 64 MiB in it) bound at the sandbox's /tmp: the host's memory, not the candidate's."""
    host_file = Path("/dev/shm") / f"optagent-test-{os.getpid()}"
    host_file.write_bytes(b"x" * (64 << 20))
    try:
        argv = [shutil.which("bwrap"), *isolation.BWRAP_NS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--bind", "/dev/shm", "/tmp", "--", "/bin/sh", "-c", "sleep 30"]
        proc = subprocess.Popen(argv)
        try:
            time.sleep(1.0)
            assert private_tmpfs_bytes([proc.pid, *(int(p) for p in _children(proc.pid))]) == 0
        finally:
            proc.kill()
            proc.wait()
    finally:
        host_file.unlink()


def _children(pid: int) -> list[str]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += kids
        todo += [int(k) for k in kids]
    return out


def test_processor_time_is_bounded_by_the_kernel():
    assert rlimits(Limits(memory_bytes=None), "cpu", False, 10.0)[RLIMITS_ENV].startswith("CPU=")
    code = "from optagent.worker.limits import apply_rlimits\napply_rlimits()\nwhile True:\n    pass"
    env = {**os.environ, RLIMITS_ENV: "CPU=1"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and time.monotonic() - t0 < 30


def test_the_disk_limit_counts_what_the_worker_adds_not_what_was_there(tmp_path):
    # A judge shares its candidate's scratch directory: the candidate's saved outputs are not its own writes.
    (tmp_path / "outputs.pt").write_bytes(b"x" * (24 << 20))
    limits = Limits(memory_bytes=None, disk_bytes=16 << 20)
    add = "import time\nwith open('mine', 'wb') as f:\n    f.write(b'x' * ({} << 20))\n    f.flush()\ntime.sleep(30)"
    assert watched([sys.executable, "-c", "import time; time.sleep(2)"], limits, tmp_path, seconds=1.5) == ""
    why = watched([sys.executable, "-c", add.format(20)], limits, tmp_path)
    assert "exceeded the 16 MiB disk limit" in why, why


def test_a_warm_workers_disk_counts_from_its_job(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path)
    try:
        watch = Watch(proc.pid, Limits(memory_bytes=None, disk_bytes=16 << 20), NO_OUTPUT, "judge", tmp_path,
                      disk_now=False)
        (tmp_path / "outputs.pt").write_bytes(b"x" * (24 << 20))  # the candidate writes while the judge waits
        assert watch.check() is None
        watch.count_disk()
        watch._next = 0.0
        assert watch.check() is None
        (tmp_path / "judge-wrote").write_bytes(b"x" * (20 << 20))
        watch._next = 0.0
        assert "exceeded the 16 MiB disk limit" in (watch.check() or "")
    finally:
        proc.kill()
        proc.wait()
