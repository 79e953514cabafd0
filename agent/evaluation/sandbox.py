"""Parent side of a worker process: spawn, isolate, time-limit, collect.

A worker is ``python -m optagent.worker`` in a new session (its own process
group), with an allowlisted environment (no API keys or tokens), its scratch
directory as working directory, and a private pipe for its answer, run under the
operating system's isolation that this machine allows (isolation.py) and within
limits on memory, processes and output (limits.py). On timeout or a limit the
whole group is killed, and so is anything that slipped out of the group but
still carries the run's marker in its environment (without a PID namespace).
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from optagent.cache import cache_root
from optagent.evaluation import isolation, safe_files
from optagent.evaluation.lanes import Control, Stopped
from optagent.evaluation.limits import LogTap, Watch, limits_for, record, rlimits
from optagent.evaluation.referee import Referee
from optagent.evaluation.report_pipe import ReportPipe
from optagent.evaluation.scratch import (scratch_fd)
from optagent.messages import M, Job, Message, parse_line, parse_messages
from optagent.schema import Device, Isolation, Mechanism
from optagent.secret_env import SECRET
from optagent.settings import CACHE_ENV, NVCC_ENV, SANDBOX_ENV, settings

ALLOWED_ENV = {
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL",
    "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX",
    "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_PTXAS_PATH", CACHE_ENV, NVCC_ENV, "XDG_CACHE_HOME",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TORCH_CUDA_ARCH_LIST",
    "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS", "TILELANG_CACHE_DIR", "TILELANG_TMP_DIR", "TILELANG_DEFAULT_TARGET",
}
MARKER = SANDBOX_ENV
# `python -m` would put the working directory (the scratch directory, which the candidate writes) first on
# sys.path, and the judge, started there after it, would import a planted `optagent` or `torch`: the
# worker is run with that entry removed before anything is imported (-P says the same from Python 3.11).
WORKER = (sys.executable, "-c", "import sys; del sys.path[0]; import runpy; "
          "runpy.run_module('optagent.worker', run_name='__main__', alter_sys=True)")
TICK = 0.25  # seconds between looks at the worker's limits
KILL_WAIT_S = 30.0  # after SIGKILL: a process the kernel cannot take down yet is left, not waited on


def child_env(device: Device, marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ALLOWED_ENV and not SECRET.search(k)}
    env[MARKER] = marker  # not the nonce: the environment is readable by the candidate
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == Device.CPU:
        env["TRITON_INTERPRET"] = "1"
    return env


@dataclass
class WorkerRun:
    """What one worker process said (its messages, in order) and how it ended."""

    messages: list[Message] = field(default_factory=list)
    foreign_lines: int = 0  # lines on the result pipe that were not the harness's
    returncode: Optional[int] = 0
    timed_out: bool = False
    wall_s: float = 0.0
    stderr_tail: str = ""
    isolation: Isolation = field(default_factory=Isolation)
    limit: Optional[str] = None  # the limit the worker broke, as a reason (it was stopped there)
    timer_secret: Optional[bytes] = None  # the native timer's: its records on the report pipe carry it
    timer_lines: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival, line) of that pipe
    referee: Optional[Referee] = None  # what the referee saw of the timed calls (evaluation/referee.py)

    def first(self, kind: type[M]) -> Optional[M]:
        return next((m for m in self.messages if isinstance(m, kind)), None)

    def all(self, kind: Union[type[M], tuple[type[M], ...]]) -> list[M]:
        return [m for m in self.messages if isinstance(m, kind)]

    @property
    def exit_text(self) -> str:
        if self.timed_out:
            return "timed out"
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exited with code {rc}"


def _kill_marked(marker: str) -> None:
    """Kill processes that left the group (setsid) but still carry this run's marker."""
    needle = f"{MARKER}={marker}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def run_worker(job: Job, timeout_s: float, on_message: Optional[Callable[[Message], None]] = None,
               control: Optional[Control] = None, prefix: Sequence[str] = (), fds: Sequence[int] = ()) -> WorkerRun:
    """Run one worker to its end; on_message sees each of its messages as it arrives (for live
    progress only: the returned messages are parsed again, from everything the pipe carried).
    control (a pool's, evaluation/lanes.py): its device and lane gate, and a stop flag; the time
    the worker waits for its lane does not count against timeout_s. prefix: a program that runs
    the worker inside the sandbox (ncu, for --profile: evaluation/profiler.py). fds: descriptors the
    worker inherits besides its pipes (the judge's saved outputs, opened by the parent)."""
    scratch = Path(job.scratch)
    dir_fd = scratch_fd(scratch)
    own_dir = dir_fd is None  # a directory new_scratch did not make (tests): opened here, before the worker
    if own_dir:
        scratch.mkdir(parents=True, exist_ok=True)
        dir_fd = safe_files.open_dir(scratch)
    try:
        return _run(job, timeout_s, on_message, control, prefix, scratch, dir_fd, fds)
    finally:
        if own_dir:
            os.close(dir_fd)


def _run(job: Job, timeout_s: float, on_message: Optional[Callable[[Message], None]], control: Optional[Control],
         prefix: Sequence[str], scratch: Path, dir_fd: int, fds: Sequence[int]) -> WorkerRun:
    # The job by descriptor, the log through the directory's descriptor: a link or FIFO the candidate
    # left in its scratch directory redirects or blocks nothing (evaluation/safe_files.py).
    job_fd = safe_files.job_fd(job)
    try:
        log_fd = safe_files.create(dir_fd, f"{job.mode}.log")
    except BaseException:
        os.close(job_fd)
        raise
    rfd, wfd = os.pipe()
    lfd, log_w = os.pipe()
    marker = secrets.token_hex(16)
    mech = isolation.mechanism()
    limits = limits_for(job.device)
    report = ReportPipe() if job.mode in ("candidate", "baseline") and job.timer is not None else None
    referee = Referee() if refereed(job) else None
    argv, env = _command(job, scratch, f"fd:{job_fd}", wfd, marker, mech, limits, prefix, timeout_s)
    control = control or Control()
    env.update(control.env)
    env.update(referee.env if referee else {})
    argv += [str(fd) for fd in report.child_fds] if report else []
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, pass_fds=(wfd, job_fd, *fds, *control.fds, *(report.child_fds if report else ()),
                                                *(referee.child_fds if referee else ())),
                                start_new_session=True, env=env, cwd=scratch, stdin=subprocess.DEVNULL,
                                stdout=log_w, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    except BaseException:
        os.close(lfd)
        os.close(rfd)
        os.close(log_fd)
        control.close()
        if report:
            report.abandon()
        if referee:
            referee.abandon()
        raise
    finally:
        os.close(wfd)
        os.close(log_w)
        os.close(job_fd)  # the child holds its own; read and closed before any candidate code
        control.spawned()
    if report:
        report.started()
    if referee:
        referee.started()
    tap = LogTap(lfd, log_fd, limits.output_bytes)
    watch = Watch(proc.pid, limits, tap, job.mode, scratch)
    limit: Optional[str] = None
    chunks: list[bytes] = []
    timed_out = False
    deadline = start + timeout_s
    interrupted = False
    pending = b""
    try:
        while True:
            left = deadline + control.waited_s() - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if control.stopped():
                raise Stopped(f"the {job.mode} process was stopped")
            limit = watch.check()
            if limit:
                break
            ready, _, _ = select.select([rfd], [], [], min(left, TICK))
            if ready:
                data = os.read(rfd, 1 << 16)
                if not data:
                    break
                chunks.append(data)
                if on_message is not None:
                    *lines, pending = (pending + data).split(b"\n")
                    if len(pending) > 1 << 20:  # no harness message is this long: not worth re-copying
                        pending = b""
                    for line in lines:
                        msg = parse_line(line, job.nonce)
                        if msg is not None:
                            on_message(msg)
    except BaseException:  # Ctrl-C or a kill of our own: take the worker down with us
        interrupted = True
        raise
    finally:
        os.close(rfd)
        if timed_out or interrupted or limit:
            _killpg(proc.pid)
        try:  # the pipe closed: the worker is ending, still watched
            late = watch.wait(proc, 5 if (timed_out or limit) else 30)
        except subprocess.TimeoutExpired:
            late = None
        if late or proc.returncode is None:
            _killpg(proc.pid)
            try:  # a process stuck in the kernel (D state) is not waited for forever
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        limit = limit or late
        _killpg(proc.pid)  # children the worker left behind in its group
        _kill_marked(marker)
        control.close()  # its lane, if it held one, is free
        tail = tap.close()[-4000:]  # read from memory, never the whole log
        lines = report.finish() if report else []
        if referee:
            referee.finish()
    messages, foreign = parse_messages(b"".join(chunks), job.nonce)
    iso = record(isolation.describe(mech), limits)
    return WorkerRun(messages, foreign, isolation.returncode(mech, proc.returncode), timed_out,
                     time.monotonic() - start, tail, iso, limit, report.secret if report else None, lines, referee)


def refereed(job: Job) -> bool:
    """Whether a referee answers this worker's timed calls: a candidate's or a baseline job's, on a CPU.
    (A GPU's microsecond calls want a referee that answers faster than a thread of this process; until
    one is measured on a GPU, the native timer's records and their checks stand alone there.)"""
    return job.mode in ("candidate", "baseline") and job.device is Device.CPU


def _command(job: Job, scratch: Path, job_file: str, wfd: int, marker: str, mech: Mechanism,
             limits, prefix: Sequence[str] = (), timeout_s: Optional[float] = None) -> tuple[list[str], dict[str, str]]:
    """The worker's command line and environment under `mech`. Only the judge may write the cache
    (measured ceilings, host speed); a candidate's compiler runs inside its sandbox, so its path is readable."""
    env = isolation.worker_env(child_env(job.device, marker), mech, scratch, trusted=job.mode == "judge")
    env.update(rlimits(limits, job.device, isolation.describe(mech).user_ns, timeout_s))
    writable = [cache_root()] if job.mode == "judge" else []
    for w in writable:
        w.mkdir(parents=True, exist_ok=True)
    reads = [p for p in (job.compiler or []) + (settings().nvcc or "").split() if os.path.isabs(p)]
    reads += [str(Path(p).resolve().parent) for p in prefix[:1] if os.path.isabs(p)]  # ncu's own folder
    env.update(isolation.landlock_env(mech, scratch, writable))
    argv = [*prefix, *WORKER, job_file, str(wfd)]
    return isolation.wrap(argv, env, mech, scratch, job.device, job.task_dir, writable, reads), env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the orchestrator dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return False
