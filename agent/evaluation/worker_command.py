"""What a worker process is started as: its command line and its environment (evaluation/sandbox.py starts it).

The environment is an allowlist (no API keys or tokens), with the run's marker that lets the parent find a
process that left the worker's group; the command line runs the worker under this machine's isolation.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from optagent.cache import cache_root
from optagent.evaluation import isolation
from optagent.evaluation.limits import rlimits
from optagent.messages import Job
from optagent.schema import Device, Mechanism
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

# The workers that never load candidate code: they alone may write the cache (the judge's measured ceilings and
# host speed, the slow cases both keep: worker/case_store.py).
TRUSTED = ("judge", "baseline")


def child_env(device: Device, marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ALLOWED_ENV and not SECRET.search(k)}
    env[MARKER] = marker  # not the nonce: the environment is readable by the candidate
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == Device.CPU:
        env["TRITON_INTERPRET"] = "1"
    return env


def command(job: Job, scratch: Path, job_file: str, wfd: int, marker: str, mech: Mechanism,
             limits, prefix: Sequence[str] = (), timeout_s: Optional[float] = None) -> tuple[list[str], dict[str, str]]:
    """The worker's command line and environment under `mech`. Only TRUSTED workers may write the cache
    (measured ceilings, host speed, slow cases); a candidate's compiler runs inside its sandbox, so its path is readable."""
    trusted = job.mode in TRUSTED
    env = isolation.worker_env(child_env(job.device, marker), mech, scratch, trusted=trusted)
    env.update(rlimits(limits, job.device, isolation.describe(mech).user_ns, timeout_s))
    writable = [cache_root()] if trusted else []
    for w in writable:
        w.mkdir(parents=True, exist_ok=True)
    reads = [p for p in (job.compiler or []) + (settings().nvcc or "").split() if os.path.isabs(p)]
    reads += [str(Path(p).resolve().parent) for p in prefix[:1] if os.path.isabs(p)]  # ncu's own folder
    env.update(isolation.landlock_env(mech, scratch, writable))
    argv = [*prefix, *WORKER, job_file, str(wfd)]
    return isolation.wrap(argv, env, mech, scratch, job.device, job.task_dir, writable, reads), env
