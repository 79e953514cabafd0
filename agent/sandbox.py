"""Parent side of a worker process: spawn, isolate, time-limit, collect.

A worker is ``python -m optagent.worker`` in a new session (its own process
group), with an allowlisted environment (no API keys or tokens), its scratch
directory as working directory, and a private pipe for its answer. On timeout
the whole group is killed, and so is anything that slipped out of the group
but still carries the run's marker in its environment.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .jobs import Job, parse_line, parse_messages

ALLOWED_ENV = {
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL",
    "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX",
    "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_PTXAS_PATH", "OPTAGENT_CACHE", "OPTAGENT_NVCC", "XDG_CACHE_HOME",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TORCH_CUDA_ARCH_LIST",
    "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS", "TILELANG_CACHE_DIR", "TILELANG_TMP_DIR", "TILELANG_DEFAULT_TARGET",
}
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)
MARKER = "OPTAGENT_SANDBOX"


def child_env(device: str, marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ALLOWED_ENV and not SECRET.search(k)}
    env[MARKER] = marker  # not the nonce: the environment is readable by the candidate
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env


@dataclass
class WorkerRun:
    messages: list[dict]
    foreign_lines: int  # lines on the result pipe that were not the harness's
    returncode: Optional[int]
    timed_out: bool
    wall_s: float
    stderr_tail: str = ""

    def first(self, kind: str) -> Optional[dict]:
        return next((m for m in self.messages if m["type"] == kind), None)

    def all(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]

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


def run_worker(job: Job, timeout_s: float, on_message: Optional[Callable[[dict], None]] = None) -> WorkerRun:
    """Run one worker to its end; on_message sees each of its messages as it arrives (for live
    progress only: the returned messages are parsed again, from everything the pipe carried)."""
    scratch = Path(job.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    job_file = scratch / f"job-{job.mode}.json"
    job_file.write_text(job.model_dump_json())
    rfd, wfd = os.pipe()
    marker = secrets.token_hex(16)
    log_path = scratch / f"{job.mode}.log"
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "optagent.worker", str(job_file), str(wfd)],
            pass_fds=(wfd,), start_new_session=True, env=child_env(job.device, marker),
            cwd=scratch, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    os.close(wfd)
    chunks: list[bytes] = []
    timed_out = False
    deadline = start + timeout_s
    interrupted = False
    pending = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], min(left, 1.0))
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
        if timed_out or interrupted:
            _killpg(proc.pid)
        try:
            proc.wait(timeout=30 if not timed_out else 5)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait()
        _killpg(proc.pid)  # children the worker left behind in its group
        _kill_marked(marker)
    tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
    messages, foreign = parse_messages(b"".join(chunks), job.nonce)
    return WorkerRun(messages, foreign, proc.returncode, timed_out, time.monotonic() - start, tail)


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


def new_scratch(root: Optional[Path] = None) -> tuple[Path, str]:
    nonce = secrets.token_hex(16)
    base = root or Path(os.environ.get("OPTAGENT_SCRATCH", Path.home() / ".cache" / "optagent" / "scratch"))
    path = base / f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{nonce[:8]}"
    path.mkdir(parents=True, exist_ok=True)
    return path, nonce


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def gpu_visible() -> bool:
    """Whether a CUDA GPU is visible, without importing torch in the orchestrator."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    if Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            return out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return False
