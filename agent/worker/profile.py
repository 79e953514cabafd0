"""The profile process (untrusted: the kernel is loaded here), run as Nsight Compute's target.

``ncu --profile-from-start off ... python -m optagent.worker JOB FD`` inside the same sandbox as
every worker (evaluation/profiler.py). Per case: the kernel runs once unprofiled (Triton compiles
and autotunes there, out of the profile), then once between cudaProfilerStart and Stop, after a
marker kernel (MARKER) that opens the case's rows in ncu's CSV: its raw page names kernels, not
cases. CaseStart says which case each group of rows is. Nothing is timed or checked here: a
passing verdict came first, and the parent reads only ncu's counters.
"""

from __future__ import annotations

from pathlib import Path

import torch

from optagent.messages import CaseStart, Channel, Done, Job
from optagent.schema import Device
from optagent.timer_records import checked_seeds
from optagent.worker.backends import backend_for
from optagent.worker.guard import lock_imports
from optagent.worker.harness import TaskRuntime

MARKER_CYCLES = 1000  # torch.cuda._sleep launches ATen's spin_kernel: a name no kernel of a task has


def _say(chan: Channel, message) -> None:
    # ncu may start its target without the result pipe: the CSV still says everything that counts
    try:
        chan.send(message)
    except OSError:
        pass


def profile(job: Job, chan: Channel) -> None:
    rt = TaskRuntime(job.task_dir, job.device)
    cuda = job.device is Device.CUDA
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        import torch.cuda.profiler as cuda_profiler  # before the lock: the harness's import, not the kernel's
    backend = backend_for(job.language, job.device, job.compiler, job.compile_timeout_s)
    lock_imports()  # no verdict rests on this process: what the guard refuses simply fails here
    backend.prepare(Path(job.source_path or ""), Path(job.scratch))
    for n, case in enumerate(job.cases):
        args, _ = rt.make_args(case, checked_seeds(job, n, case)[0][1])
        fn = backend.load_fresh(f"{n}_{case.label}_profiled")
        fn(*args)  # compiled and autotuned here, outside the profiled range
        sync()
        _say(chan, CaseStart(case=case.label))
        if cuda:
            cuda_profiler.start()
            torch.cuda._sleep(MARKER_CYCLES)
        fn(*args)
        sync()
        if cuda:
            cuda_profiler.stop()
        del args, fn
    _say(chan, Done())
