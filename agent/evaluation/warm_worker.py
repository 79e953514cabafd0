"""The judge, started beside its candidate's process instead of after it.

A fresh worker costs seconds before its first useful line (Python, torch, the GPU's context), and the
judge used to pay them after its candidate had ended. A warm judge is started with the candidate, in
the same isolation and scratch directory as a judge always is, does that work (worker/__main__.py
warm_up) and then waits on a socket only the parent holds the other end of. Once the candidate has
ended, the parent opens the saved outputs as before (evaluation/safe_files.py) and sends the job with
their descriptors (job_channel.py); the judge's time limit counts from then. A candidate that fails
before a case ran never needs its judge: the warm one is taken down unused.

Only on a GPU (see available()), and only under bubblewrap: there each worker has a PID namespace of its own and a private /tmp, so the
candidate cannot reach the process that waits beside it; under Landlock alone the two would share one
process table, and the judge starts after its candidate as before.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Callable, Optional

from optagent import job_channel
from optagent.evaluation import isolation
from optagent.evaluation.lanes import Control
from optagent.evaluation.sandbox import Spawned, WorkerRun, collect, spawn
from optagent.evaluation.scratch import scratch_fd
from optagent.messages import Job, Message
from optagent.schema import Device, Mechanism


def available(device: Device) -> bool:
    """On a GPU under bubblewrap. Not on a CPU: there the judge's imports would take cores from the candidate
    while it runs, and on a CPU the referee's clock (evaluation/referee.py) times the candidate's windows."""
    return device is Device.CUDA and isolation.mechanism() is Mechanism.BWRAP


class WarmWorker:
    def __init__(self, template: Job, timeout_s: float, control: Optional[Control] = None):
        """template: the job as far as it is known at the start (mode, device, task, scratch)."""
        dir_fd = scratch_fd(Path(template.scratch))
        if dir_fd is None:
            raise ValueError(f"{template.scratch}: not a scratch directory new_scratch made")
        self.timeout_s = timeout_s
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent
        child_fd = child.detach()  # spawn() passes it to the worker and closes it here
        try:
            self.spawned: Spawned = spawn(template, child_fd, f"sock:{child_fd}", timeout_s, control, (),
                                          Path(template.scratch), dir_fd)
        except BaseException:
            parent.close()
            raise

    def run(self, job: Job, fds: list[int],
            on_message: Optional[Callable[[Message], None]] = None) -> Optional[WorkerRun]:
        """Send the job (and the descriptors it names) and read the worker to its end; None, nothing sent,
        when the worker is no longer there to take it (it died while it waited): the caller starts one."""
        if self.spawned.proc.poll() is not None:
            self.abandon()
            return None
        since = time.monotonic()
        self.spawned.watch.count_disk()  # the candidate's outputs are there: the judge's own writes count
        try:
            job_channel.send(self.sock, job.model_dump_json().encode(), fds)
        except OSError:
            pass  # it died while it waited: collect() says how
        finally:
            self.sock.close()
        return collect(self.spawned, job, self.timeout_s, on_message, since)

    def abandon(self) -> None:
        """Not needed (or the evaluation ended otherwise): taken down, nothing sent."""
        self.sock.close()
        self.spawned.abandon()

