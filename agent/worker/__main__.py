"""Child side of an evaluation: ``python -m optagent.worker fd:JOB_FD RESULT_FD [SECRET_FD REPORT_FD]``.

The job comes by descriptor (``fd:N``). Five modes. ``candidate`` (untrusted: the kernel is loaded here) times the
baseline before any candidate code exists in the process, then per case loads
a fresh copy of the kernel, runs it on the package's inputs and on freshly
drawn ones, times it, and saves its outputs. ``judge`` (trusted: never loads the
candidate) rebuilds the same inputs from the seeds, computes the references and
gives the verdicts. ``baseline`` times the baselines alone (a pool's, once per
lane). ``probe`` loads a package for ``optagent task validate``. ``profile`` (untrusted, under
ncu, for --profile) runs the kernel once per case for Nsight Compute (worker/profile.py).
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from pathlib import Path

from optagent.worker import lane  # first: its clock starts the cost split's imports
from optagent import job_channel
from optagent.messages import Channel, Job, WorkerError
from optagent.schema import Device
from optagent.worker import landlock, seccomp
from optagent.worker.limits import apply_rlimits


def read_job(where: str) -> Job:
    """The job: ``fd:N`` is the parent's memory file (evaluation/safe_files.py), read and closed; ``sock:N`` a
    socket the job comes on later (a warm worker: job_channel.py), its descriptors mapped to this process's
    numbers; a path is read and unlinked. It holds the nonce and the seeds: gone before any candidate code runs."""
    if where.startswith("fd:"):
        with os.fdopen(int(where[3:]), "rb") as f:
            return Job.model_validate_json(f.read())
    if where.startswith("sock:"):
        with socket.socket(fileno=int(where[5:])) as sock:
            return next_job(sock)
    path = Path(where)
    data = path.read_bytes()
    path.unlink()
    return Job.model_validate_json(data)


def next_job(sock: socket.socket) -> Job:
    """The next job on a warm worker's socket, its descriptors mapped to this process's numbers (EOFError: none)."""
    data, mapped = job_channel.receive(sock)
    job = Job.model_validate_json(data)
    samples = {case: [s.model_copy(update={"fd": mapped.get(s.fd) if s.fd is not None else None}) for s in listed]
               for case, listed in job.samples.items()}
    gate = mapped.get(job.gate_fd) if job.gate_fd is not None else None
    return job.model_copy(update={"samples": samples, "gate_fd": gate})


def serve(sock_fd: int, result_fd: int) -> None:
    """A judge that serves one evaluation after another (evaluation/judges.py JudgeService): each job's answer
    ends with its Done, on the one result pipe, under the job's own nonce; the socket's end is the process's.
    It loads no candidate code, ever: what it keeps from one job to the next is the harness's own."""
    import torch

    from optagent.worker.judge import judge

    with socket.socket(fileno=sock_fd) as sock:
        while True:
            try:
                job = next_job(sock)
            except EOFError:
                return
            chan = Channel(result_fd, job.nonce)
            try:
                judge(job, chan)
            except BaseException as e:  # the parent reads the job's end from it, and starts another judge
                chan.send(WorkerError(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=-4)))
                raise SystemExit(3)
            finally:
                sys.stdout.flush()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the job's inputs and references: not held while candidates run


def warm_up() -> None:
    """A warm worker (a judge started beside its candidate, or a candidate process started before its
    candidate was known) does what every worker does first while it waits: torch, Triton and the harness's
    modules imported, and the device's context made on a GPU. Only the harness's own code runs here: no job,
    no candidate, no nonce yet."""
    import torch

    from optagent.worker import candidate, judge  # noqa: F401

    try:
        import triton  # a Triton candidate's first import, a few hundred ms
    except ImportError:
        triton = None
    if not os.environ.get("TRITON_INTERPRET") and torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        if triton is not None:  # Triton's CUDA driver: its helper module built (gcc) and loaded, 0.4 s on the H200
            triton.runtime.driver.active.get_current_device()
    if triton is not None:  # the hash of Triton's own files (libtriton read whole) that every kernel's cache key
        from triton.runtime.cache import triton_key  # starts with: 0.39 s of a candidate's first compile on the H200

        triton_key()  # cached for the process (functools.lru_cache)


def main() -> None:
    apply_rlimits()
    serving = sys.argv[1].startswith("serve:")
    warm = serving or sys.argv[1].startswith("sock:")
    if warm:
        landlock.apply_from_env()
        warm_up()
        try:  # the parent's lane waits for no start-up of ours now
            os.write(int(sys.argv[1].partition(":")[2]), job_channel.WARM)
        except OSError:
            pass  # the parent has gone, or taken us down
    if serving:
        serve(int(sys.argv[1][6:]), int(sys.argv[2]))
        os._exit(0)
    job = read_job(sys.argv[1])
    if warm:
        lane.job_arrived(job.gate_fd)
    chan = Channel(int(sys.argv[2]), job.nonce)
    try:
        if not warm:
            landlock.apply_from_env()  # before any package or candidate code: the file system read-only but scratch
        if job.mode in ("candidate", "profile"):  # the processes that load candidate code
            seccomp.restrict()
        if job.mode in ("candidate", "baseline") and job.timer is not None:
            # argv: ... RESULT_FD SECRET_FD REPORT_FD; before any candidate code. The baseline job's
            # timings come from the same timer, so a pool's speedups compare like with like.
            from optagent.worker import timers

            timers.NATIVE = timers.load_native(job.timer, job, int(sys.argv[3]), int(sys.argv[4]))
        if job.mode in ("candidate", "baseline") and job.device is Device.CPU:
            # the timed processes' torch ops (the harness's redraws between timed calls) on one thread: a pool as
            # wide as the host stalls at every op's barrier while another process holds a core, and the referee's
            # clock counts the stall (measured on 2 cores beside three busy processes: windows of a call that does
            # nothing 12-40 ms with the pool, 0.2-8 ms with one thread)
            import torch

            torch.set_num_threads(1)
        if job.mode == "candidate":
            from optagent.worker.candidate import Candidate

            Candidate(job, chan).run()
        elif job.mode == "baseline":
            from optagent.worker.candidate import Candidate

            Candidate(job, chan).run_baselines()
        elif job.mode == "profile":
            from optagent.worker.profile import profile

            profile(job, chan)
        elif job.mode == "judge":
            from optagent.worker.judge import judge

            judge(job, chan)
        else:
            from optagent.worker.judge import probe

            probe(job, chan)
    except BaseException as e:  # everything reaches the parent as a status, not a traceback
        tb = traceback.format_exc(limit=-4)
        chan.send(WorkerError(error=f"{type(e).__name__}: {e}", traceback=tb))
        raise SystemExit(3)
    finally:
        sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks do not run after "done"


if __name__ == "__main__":
    main()
