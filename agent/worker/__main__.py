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
import sys
import traceback
from pathlib import Path

from optagent.worker import lane  # noqa: F401 (first: its clock starts the cost split's imports)
from optagent.messages import Channel, Job, WorkerError
from optagent.worker import landlock, seccomp
from optagent.worker.limits import apply_rlimits


def read_job(where: str) -> bytes:
    """The job: ``fd:N`` is the parent's memory file (evaluation/safe_files.py), read and closed; a
    path is read and unlinked. It holds the nonce and the seeds: gone before any candidate code runs."""
    if where.startswith("fd:"):
        with os.fdopen(int(where[3:]), "rb") as f:
            return f.read()
    path = Path(where)
    data = path.read_bytes()
    path.unlink()
    return data


def main() -> None:
    apply_rlimits()
    job = Job.model_validate_json(read_job(sys.argv[1]))
    chan = Channel(int(sys.argv[2]), job.nonce)
    try:
        landlock.apply_from_env()  # before any package or candidate code: the file system read-only but scratch
        if job.mode in ("candidate", "profile"):  # the processes that load candidate code
            seccomp.restrict()
        if job.mode in ("candidate", "baseline") and job.timer is not None:
            # argv: ... RESULT_FD SECRET_FD REPORT_FD; before any candidate code. The baseline job's
            # timings come from the same timer, so a pool's speedups compare like with like.
            from optagent.worker import timers

            timers.NATIVE = timers.load_native(job.timer, job, int(sys.argv[3]), int(sys.argv[4]))
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
