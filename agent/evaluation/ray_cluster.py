"""Reaching a Ray cluster for the evaluation pool: connect, count its lanes, what an actor's environment takes.

Imported only for ``--cluster ray`` (Ray is the optional extra ``cluster``): Ray itself imports no torch,
so the orchestrator still never does.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Optional

import ray
import ray.exceptions as rex

from optagent.text import first_line
from optagent.settings import (CACHE_ENV, ISOLATION_ENV, MEMORY_ENV, NVCC_ENV, SCRATCH_ENV, UserError,
                               settings)

# The orchestrator's settings that shape an evaluation, given to each actor's environment as they are here
# (a remote node does not see this process's environment); nothing else travels, and no secret does.
TRAVELS = (ISOLATION_ENV, MEMORY_ENV, NVCC_ENV, CACHE_ENV, SCRATCH_ENV)
# A local instance's object store holds a package archive and JSON records: not 30% of the host's memory.
OBJECT_STORE_BYTES = 512 << 20
# What a lost actor, worker or node looks like from the caller: its call's work is queued again.
LOST = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError,
        rex.LocalRayletDiedError, rex.OutOfMemoryError)


class ClusterError(UserError):
    """The cluster cannot evaluate the run: one line, exit 2; every step committed so far stays."""


def where(address: Optional[str]) -> str:
    return f"--cluster ray{'=' + address if address else ''}"


def connect(address: Optional[str], cpus: int = 1) -> bool:
    """ray.init unless this process is already connected (a caller's cluster, tests): True when it
    started or joined one here (close() then shuts it down). Without an address, a local instance with
    at least `cpus` CPUs, so that the CPU lanes' actors fit."""
    if ray.is_initialized():
        return False
    if address and address != "auto" and "://" not in address:
        _reachable(address)
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            # "local": a new instance of our own, not one a `ray start` left running (ray=auto joins that)
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, **quiet)
    except (ConnectionError, RuntimeError, ValueError, rex.RayError) as e:
        raise ClusterError(f"{where(address)}: Ray did not start: {first_line(str(e)) or type(e).__name__}") from None
    return True


def _reachable(address: str) -> None:
    """A HOST:PORT nobody answers at fails in seconds here, instead of Ray's minutes of retries."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"{where(address)}: the address must be HOST:PORT (the head's GCS port), auto, "
                           "or a ray:// client address")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise ClusterError(f"{where(address)}: nothing answers at {address} ({e.strerror or e})") from None


def cpu_lanes() -> int:
    """On the CPU, as many lanes as OPTAGENT_CPU_LANES says (default 1), as locally."""
    return max(1, int(settings().cpu_lanes or 1))  # as locally: CPU lanes are labels, more of them for tests


def gpu_lanes(address: Optional[str]) -> int:
    """One lane a GPU of the whole cluster."""
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise ClusterError(f"{where(address)}: the cluster has no GPU for a cuda run (--device cpu runs on its CPUs)")
    return gpus


def actor_env() -> dict[str, str]:
    return {k: os.environ[k] for k in TRAVELS if os.environ.get(k)}


