"""Which GPUs this host lets the pool use, found without importing torch (the orchestrator never does): a lane
each (evaluation/lanes.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def _driver_gpus() -> int:
    """How many GPUs the driver reports, without importing torch (procfs, else nvidia-smi)."""
    procfs = Path("/proc/driver/nvidia/gpus")
    if procfs.is_dir():
        n = sum(1 for _ in procfs.iterdir())
        if n:
            return n
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU")) if out.returncode == 0 else 0
        except (OSError, subprocess.TimeoutExpired):
            return 0
    return 0


def visible_gpus() -> list[str]:
    """The GPUs this host lets us use, as CUDA_VISIBLE_DEVICES entries; without importing torch."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for item in (x.strip() for x in listed.split(",")):
            if not item or item.startswith("-"):
                break  # CUDA stops at the first invalid entry
            out.append(item)
        return out
    return [str(i) for i in range(_driver_gpus())]


def gpu_visible() -> bool:
    """Whether a CUDA GPU is visible here: one the driver reports, not hidden by CUDA_VISIBLE_DEVICES."""
    return bool(visible_gpus()) and _driver_gpus() > 0
