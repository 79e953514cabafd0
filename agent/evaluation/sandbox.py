"""Parent side of a worker process: spawn, isolate, time-limit, collect.

A worker is ``python -m optagent.worker`` in a new session (its own process
group), with an allowlisted environment (no API keys or tokens), its scratch
directory as working directory, and a private pipe for its answer, run under the
operating system's isolation that this machine allows (isolation.py) and within
limits on memory, processes and output (limits.py). On timeout or a limit the
whole group is killed, and so is anything that slipped out of the group but
still carries the run's marker in its environment (take_down.py).
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from optagent.evaluation import isolation, safe_files, take_down
from optagent.evaluation.gates import Control, Stopped
from optagent.evaluation.limits import Watch, limits_for, record
from optagent.evaluation.log_tap import LogTap
from optagent.evaluation.referee import SPIN_S, Referee
from optagent.evaluation.report_pipe import ReportPipe
from optagent.evaluation.scratch import scratch_fd
from optagent.messages import Done, M, Job, Message, parse_line, parse_messages
from optagent.schema import Isolation, Mechanism
from optagent.evaluation.worker_command import MARKER, command

TICK = 0.25  # seconds between looks at the worker's limits
FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})  # never a fault's own


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
    def killed_from_outside(self) -> bool:
        """Ended by a signal that no limit, timeout or stop of the parent's sent and that no fault of its own code
        raises (retries.once_more_if_killed): an operator's, the kernel's OOM killer's, a neighbour's."""
        rc = self.returncode
        return rc is not None and -rc in FROM_OUTSIDE and not self.timed_out and self.limit is None

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


def run_worker(job: Job, timeout_s: float, on_message: Optional[Callable[[Message], None]] = None,
               control: Optional[Control] = None, prefix: Sequence[str] = (), fds: Sequence[int] = ()) -> WorkerRun:
    """Run one worker to its end; on_message sees each of its messages as it arrives (for live
    progress only: the returned messages are parsed again, from everything the pipe carried).
    control (a pool's, evaluation/gates.py): its device and lane gate, and a stop flag; the time
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


@dataclass
class Spawned:
    """A worker process started, with everything the parent holds of it until it is collected."""

    job: Job  # what the worker was started for: its mode, device and scratch (a warm worker's real job comes later)
    proc: subprocess.Popen
    rfd: int  # the result pipe's read end
    tap: LogTap
    watch: Watch
    marker: str
    mech: Mechanism
    control: Control
    report: Optional[ReportPipe]
    referee: Optional[Referee]
    start: float
    collected: bool = False  # collect() has taken it down and closed what the parent held

    def abandon(self) -> None:
        """The worker is not wanted after all (a judge whose candidate failed): taken down and collected as a
        worker out of time is, so that what the parent holds of it is closed in one place (collect)."""
        if not self.collected:
            collect(self, self.job, 0.0, None, time.monotonic())


def _run(job: Job, timeout_s: float, on_message: Optional[Callable[[Message], None]], control: Optional[Control],
         prefix: Sequence[str], scratch: Path, dir_fd: int, fds: Sequence[int]) -> WorkerRun:
    # The job by descriptor: nothing on disk to plant or redirect (evaluation/safe_files.py).
    job_fd = safe_files.job_fd(job)
    spawned = spawn(job, job_fd, f"fd:{job_fd}", timeout_s, control, prefix, scratch, dir_fd, fds)
    return collect(spawned, job, timeout_s, on_message, spawned.start)


def spawn(job: Job, job_fd: int, job_arg: str, timeout_s: float, control: Optional[Control], prefix: Sequence[str],
          scratch: Path, dir_fd: int, fds: Sequence[int] = ()) -> Spawned:
    """Start the worker for `job` (its job to be read from job_fd, named to it as job_arg); job_fd is closed
    here, the child holding its own. The log goes through the directory's descriptor: a link or FIFO the
    candidate left in its scratch directory redirects or blocks nothing (evaluation/safe_files.py)."""
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
    referee = Referee(SPIN_S[job.device]) if refereed(job) else None
    argv, env = command(job, scratch, job_arg, wfd, marker, mech, limits, prefix, timeout_s)
    control = control or Control()
    env.update(control.env)
    env.update(referee.env if referee else {})
    argv += [str(fd) for fd in report.child_fds] if report else []
    start = time.monotonic()
    proc: Optional[subprocess.Popen] = None
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
        control.spawned(proc.pid if proc is not None else None, marker)
    if report:
        report.started()
    if referee:
        referee.started()
    tap = LogTap(lfd, log_fd, limits.output_bytes)
    watch = Watch(proc.pid, limits, tap, job.mode, scratch, disk_now=not job_arg.startswith(("sock:", "serve:")))
    return Spawned(job, proc, rfd, tap, watch, marker, mech, control, report, referee, start)


def collect(sp: Spawned, job: Job, timeout_s: float, on_message: Optional[Callable[[Message], None]],
            since: float, keep: bool = False) -> WorkerRun:
    """Read the worker's messages to its end (timeout_s counted from `since`), then take it down. A judge's answer
    ends at its Done: trusted, it has nothing more to say, and its exit (its GPU context torn down) is waited for in
    the background (take_down.in_background) instead of before its verdicts count; keep: a judge that serves the
    next job too (judges.py JudgeService) is left as it is once it has answered."""
    proc, rfd, control, watch = sp.proc, sp.rfd, sp.control, sp.watch
    limit: Optional[str] = None
    chunks: list[bytes] = []
    timed_out = False
    deadline = since + timeout_s
    interrupted = False
    answered = False  # a judge's Done was read
    until_done = job.mode == "judge"
    pending = b""
    try:
        while True:
            left = deadline + control.waited_s() - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if control.stopped():
                raise Stopped(f"the {job.mode} process was stopped")
            limit = watch.check() or control.limit()
            if limit:
                break
            ready, _, _ = select.select([rfd], [], [], min(left, TICK))
            if ready:
                data = os.read(rfd, 1 << 16)
                if not data:
                    break
                chunks.append(data)
                if on_message is not None or until_done:
                    *lines, pending = (pending + data).split(b"\n")
                    if len(pending) > 1 << 20:  # no harness message is this long: not worth re-copying
                        pending = b""
                    for line in lines:
                        msg = parse_line(line, job.nonce)
                        if msg is not None and on_message is not None:
                            on_message(msg)
                        answered = answered or (until_done and isinstance(msg, Done))
                    if answered:
                        break
    except BaseException:  # Ctrl-C or a kill of our own: take the worker down with us
        interrupted = True
        raise
    finally:
        kept = keep and answered  # a serving judge: its result pipe, log and limits stay with it for its next job
        sp.collected = not kept
        if not kept:
            os.close(rfd)
            if answered:
                take_down.in_background(proc, watch, sp.marker, control, sp.tap.close)
            else:
                if timed_out or interrupted or limit:
                    take_down.kill_group(proc.pid)
                # always taken down: its marked processes killed, its lane freed (a limit broken meanwhile counts)
                late = take_down.take_down(proc, watch, sp.marker, control, 5 if (timed_out or limit) else 30)
                limit = limit or late
        tail = (sp.tap.tail_now() if answered else sp.tap.close())[-4000:]  # read from memory, never the whole log
        lines = sp.report.finish() if sp.report else []
        if sp.referee:
            sp.referee.finish()
    messages, foreign = parse_messages(b"".join(chunks), job.nonce)
    iso = record(isolation.describe(sp.mech), sp.watch.limits)
    code = 0 if answered else isolation.returncode(sp.mech, proc.returncode)
    return WorkerRun(messages, foreign, code, timed_out,
                     time.monotonic() - since, tail, iso, limit, sp.report.secret if sp.report else None, lines,
                     sp.referee)


def refereed(job: Job) -> bool:
    """Whether a referee answers this worker's timed calls: a candidate's or a baseline job's, on any device (its
    clock floors the recorded time on each: evaluation/referee.py)."""
    return job.mode in ("candidate", "baseline")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the orchestrator dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
