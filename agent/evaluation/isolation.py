"""The operating system's part of the sandbox: which isolation this machine allows, and the
command line that gives it to a worker process.

Found out once per process by a trial run, in this order: bubblewrap (``bwrap``), then
Landlock (worker/landlock.py, with util-linux ``unshare``'s namespaces where they work); with
neither, no untrusted code runs: the evaluation refuses to start, saying what to install.
``OPTAGENT_ISOLATION=auto|bwrap|landlock|unshare|none`` forces a choice; ``unshare`` alone (a
writable file system) and ``none`` run only when asked for by name. Under bwrap a worker gets its own user (uid 65534 inside), PID, network, IPC and UTS
namespaces, a read-only view of the file system with only its scratch directory writable, a
private /tmp, /dev/shm and /run, a fresh /proc that shows only its own processes, a minimal
/dev (plus the NVIDIA device nodes on a GPU), and other evaluations' scratch directories
hidden. Only trusted workers (the judge, the lane's baseline job) may write optagent's cache (measured
ceilings, host speed, slow cases: worker/case_store.py), which candidates read. Under landlock the worker makes, as its first act, every path but its scratch
directory (and the cache, for a trusted worker) read-only to itself and all it starts, and refuses
itself TCP and signals to processes outside (kernels with Landlock ABI 4 and 6). Under unshare
a worker gets the namespaces but a writable file system. In a user namespace a process cannot
read the /proc files (environ, mem) of a process outside.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from optagent.cache import TRITON_BUILDS, cache_root
from optagent.schema import Isolation, Mechanism
from optagent.settings import CACHE_ENV, ISOLATION_ENV as ENV, EnvError, settings
from optagent.worker import landlock

CHOICES = ("auto", "bwrap", "landlock", "unshare", "none")
INSTALL = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or run on Linux >= 5.13 with Landlock "
           f"enabled; or pass --isolation none ({ENV}=none) to run candidate kernels with no sandbox, as your user")
NOBODY = "65534"
HIDDEN = ("/tmp", "/run")  # replaced by empty ones: sockets (/run/docker.sock) and other users' files
TMP_BYTES = 1 << 30  # the private /tmp and /dev/shm are memory: bounded
BWRAP_NS = ["--unshare-user", "--uid", NOBODY, "--gid", NOBODY, "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
UNSHARE_NS = ["--user", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts"]
# Kept where a GPU needs them: the daemon that holds the driver loaded between processes.
GPU_RUN = ("/run/nvidia-persistenced",)


def requested() -> str:
    return settings().isolation


def _try(argv: list[str]) -> Optional[str]:
    """None when the command runs, else the first line of why not."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, env={"PATH": os.defpath},
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if out.returncode == 0:
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else f"exit code {out.returncode}"


@functools.cache
def _bwrap_problem() -> Optional[str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    true = shutil.which("true") or "/bin/true"
    why = _try([exe, *BWRAP_NS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--", true])
    return f"bwrap does not work here: {why}" if why else None


@functools.cache
def _unshare_flags() -> tuple[Optional[list[str]], str]:
    """unshare's flags that work here (an unprivileged uid inside if this util-linux can), or why none do."""
    exe = shutil.which("unshare")
    if exe is None:
        return None, "unshare is not installed (util-linux)"
    true = shutil.which("true") or "/bin/true"
    why = ""
    for mapping in (["--map-user=" + NOBODY, "--map-group=" + NOBODY], ["--map-root-user"]):
        why = _try([exe, *mapping, *UNSHARE_NS, true]) or ""
        if not why:
            return [exe, *mapping, *UNSHARE_NS], ""
    return None, f"unshare does not work here: {why}"


@functools.cache
def _landlock_problem() -> Optional[str]:
    return None if landlock.abi() >= 1 else "Landlock is not available in this kernel (Linux >= 5.13, landlock enabled)"


def mechanism() -> Mechanism:
    """The mechanism to use now; EnvError when a forced one does not work here, or when nothing
    that keeps the file system read-only does (candidates never run on a writable host unasked)."""
    want = requested()
    if want == "none":
        return Mechanism.NONE
    if want in ("auto", "bwrap"):
        why = _bwrap_problem()
        if why is None:
            return Mechanism.BWRAP
        if want == "bwrap":
            raise EnvError(f"{ENV}=bwrap: {why}")
    if want in ("auto", "landlock"):
        lwhy = _landlock_problem()
        if lwhy is None:
            return Mechanism.LANDLOCK
        if want == "landlock":
            raise EnvError(f"{ENV}=landlock: {lwhy}")
        raise EnvError(f"no sandbox for candidate kernels here ({why}; {lwhy}): {INSTALL}")
    flags, why = _unshare_flags()
    if flags is None:
        raise EnvError(f"{ENV}=unshare: {why}")
    return Mechanism.UNSHARE


def describe(mech: Mechanism) -> Isolation:
    """The record of what `mech` keeps from the candidate (limits are added by the caller)."""
    if mech is Mechanism.NONE:
        return Isolation()
    ns = mech is not Mechanism.LANDLOCK or _unshare_flags()[0] is not None
    return Isolation(mechanism=mech, user_ns=ns, pid_ns=ns, no_network=ns, ro_fs=mech is not Mechanism.UNSHARE)


def _under(path: Path, dirs: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


def _outermost(paths: list[Path]) -> list[Path]:
    kept: list[Path] = []
    for p in sorted(set(paths), key=lambda p: len(p.parts)):
        if not _under(p, kept):
            kept.append(p)
    return kept


def _paths_from(env: dict[str, str], extra: list[str]) -> list[Path]:
    """Every path a worker may need to read: the interpreter, its libraries, optagent, the env's paths."""
    import optagent

    raw = [sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(sys.executable),
           os.path.dirname(os.path.realpath(sys.executable)), str(Path(optagent.__file__).resolve().parent),
           *sys.path, *extra]
    for name in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "CUDA_HOME", "CUDA_PATH",
                 "VIRTUAL_ENV", "CONDA_PREFIX", "TRITON_PTXAS_PATH", "TRITON_HOME"):
        raw.extend(env.get(name, "").split(os.pathsep))
    out = []
    for p in raw:
        if p and os.path.isabs(p):
            out.append(Path(p))
            out.append(Path(os.path.realpath(p)))
    return out


def gpu_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia*"))


def wrap(argv: list[str], env: dict[str, str], mech: Mechanism, scratch: Path, device: str, task_dir: str,
         writable: list[Path], extra_reads: list[str]) -> list[str]:
    """argv as run under `mech`. `env` is the worker's environment (its paths are made readable);
    `writable` are the paths besides the scratch directory it may write (bwrap only)."""
    if mech is Mechanism.NONE:
        return argv
    if mech in (Mechanism.UNSHARE, Mechanism.LANDLOCK):  # landlock: the worker restricts itself (landlock_env)
        flags, _ = _unshare_flags()
        assert flags is not None or mech is Mechanism.LANDLOCK
        return [*(flags or []), *argv]
    scratch = scratch.resolve()
    cmd = [shutil.which("bwrap") or "bwrap", *BWRAP_NS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if device == "cuda":
        for node in gpu_nodes():
            cmd += ["--dev-bind-try", node, node]
    hidden = [Path(d) for d in HIDDEN if os.path.isdir(d)]
    cmd += ["--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
    for d in hidden:
        cmd += ["--size", str(TMP_BYTES), "--tmpfs", str(d)] if d == Path("/tmp") else ["--tmpfs", str(d)]
    wanted = _paths_from(env, [task_dir, str(cache_root()), *extra_reads, *(GPU_RUN if device == "cuda" else ())])
    writable = [w.resolve() for w in writable]
    # what the empty /tmp and /run hide but the worker needs (a venv in /tmp), never the whole of one
    reads = [p for p in _outermost([p for p in wanted if _under(p, hidden) and p not in hidden])
             if not _under(p, writable)]
    for p in reads:
        cmd += ["--ro-bind-try", str(p), str(p)]
    for w in writable:
        cmd += ["--bind", str(w), str(w)]
    # Other evaluations' scratch directories (job files, outputs): an empty directory in their place.
    base = scratch.parent
    if not _under(base, hidden) and not any(_under(p, [base]) for p in [*reads, *writable]):
        cmd += ["--tmpfs", str(base)]
    cmd += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch), "--", *argv]
    return cmd


def worker_env(env: dict[str, str], mech: Mechanism, scratch: Path, trusted: bool = False) -> dict[str, str]:
    """The worker's environment under `mech`: caches it must write point into its scratch directory,
    or, for a trusted worker (the judge), into the cache only trusted workers write."""
    env = {**env, CACHE_ENV: str(cache_root())}  # the same cache, whatever HOME says inside
    # Compiler caches per evaluation under every mechanism: concurrent evaluations (a pool) never
    # share one, and no kernel leaves a cached binary for another to load. The judge shares the
    # candidate's scratch directory, so its caches are elsewhere: a binary the candidate planted in
    # its own cache would otherwise compute the judge's reference.
    caches = cache_root() / "judge" if trusted else scratch
    env.update(TRITON_CACHE_DIR=str(caches / TRITON_BUILDS), CUDA_CACHE_PATH=str(caches / ".nv"),
               TILELANG_CACHE_DIR=str(caches / ".tilelang"))
    if mech is Mechanism.BWRAP:
        env.update(TMPDIR="/tmp", TILELANG_TMP_DIR="/tmp")
    elif mech is Mechanism.LANDLOCK:  # the host's /tmp is read-only to it
        env.update(TMPDIR=str(scratch), TILELANG_TMP_DIR=str(scratch))
    return env


def landlock_env(mech: Mechanism, scratch: Path, writable: list[Path]) -> dict[str, str]:
    """The paths a worker under landlock may write (worker/landlock.py): its scratch, and `writable`."""
    if mech is not Mechanism.LANDLOCK:
        return {}
    return {landlock.ENV: os.pathsep.join(str(p) for p in (scratch, *writable))}


def returncode(mech: Mechanism, rc: Optional[int]) -> Optional[int]:
    """The worker's own exit status: bwrap reports a child killed by signal N as 128 + N."""
    if mech is Mechanism.BWRAP and rc is not None and 128 < rc < 128 + 65:
        return -(rc - 128)
    return rc
