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

Spares: a run's pool (evaluation/pool.py) keeps candidate processes started the same way before their
candidates are known, each in a scratch directory of its own, so that a candidate's start-up (Python,
torch, Triton, the GPU's context: 4 s of its 15 on the H200) is paid while the planner thinks and the
previous candidate runs. A spare has run only the harness's own code when its job comes (with its lane's
gate, on the socket); it serves one candidate and ends, as every candidate process does, so nothing of one
candidate reaches the next (under bubblewrap a candidate cannot see the spare that waits beside it either).
The pool's judges are warm workers too, started once and serving one evaluation after another
(judges.py JudgeService; serving=True: worker/__main__.py serve).
"""

from __future__ import annotations

import queue
import select
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from optagent import job_channel
from optagent.evaluation import isolation
from optagent.evaluation.gates import Control
from optagent.evaluation.sandbox import Spawned, WorkerRun, collect, spawn
from optagent.evaluation.scratch import remove_scratch, scratch_fd
from optagent.messages import Job, Message
from optagent.schema import Device, Mechanism


def available(device: Device) -> bool:
    """On a GPU under bubblewrap. Not on a CPU: there the judge's imports would take cores from the candidate
    while it runs, and on a CPU the referee's clock (evaluation/referee.py) times the candidate's windows."""
    return device is Device.CUDA and isolation.mechanism() is Mechanism.BWRAP


class WarmWorker:
    def __init__(self, template: Job, timeout_s: float, control: Optional[Control] = None, serving: bool = False):
        """template: the job as far as it is known at the start (mode, device, task, scratch). serving: a judge
        that serves one job after another (judges.py JudgeService), each run() answered at its Done."""
        dir_fd = scratch_fd(Path(template.scratch))
        if dir_fd is None:
            raise ValueError(f"{template.scratch}: not a scratch directory new_scratch made")
        self.timeout_s, self.serving = timeout_s, serving
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent  # the job goes out on it; job_channel.WARM comes back once the start-up is over
        self._warm = threading.Event()
        self.warm_at: Optional[float] = None  # when the parent heard its start-up was over (tests, bench/)
        self._sock_lock = threading.Lock()  # warm() reads the socket from a lane's thread; run() closes it
        child_fd = child.detach()  # spawn() passes it to the worker and closes it here
        try:
            self.spawned: Spawned = spawn(template, child_fd, f"{'serve' if serving else 'sock'}:{child_fd}", timeout_s,
                                          control, (), Path(template.scratch), dir_fd)
        except BaseException:
            parent.close()
            raise

    @property
    def scratch(self) -> Path:
        return Path(self.spawned.job.scratch)

    @property
    def nonce(self) -> str:
        """The nonce of the scratch directory it was started in: its job's (the worker has never seen it)."""
        return self.spawned.job.nonce

    def run(self, job: Job, fds: list[int], on_message: Optional[Callable[[Message], None]] = None,
            gate: Optional[Control] = None) -> Optional[WorkerRun]:
        """Send the job (and the descriptors it names) and read the worker to its end; None, nothing sent,
        when the worker is no longer there to take it (it died while it waited): the caller starts one.
        gate: a spare's lane gate (evaluation/gates.py), sent with the job; it then stands for the process."""
        if self.spawned.proc.poll() is not None:
            self.abandon()
            return None
        since = time.monotonic()
        self.spawned.watch.count_disk()  # the candidate's outputs are there: the judge's own writes count
        if gate is not None:
            self.spawned.control.close()
            self.spawned.control = gate  # its stop flag, its lane wait, and its close when the process ends
            fds = [*fds, *gate.fds]
            job = job.model_copy(update={"gate_fd": gate.fds[0] if gate.fds else None})
        try:
            job_channel.send(self.sock, job.model_dump_json().encode(), fds)
        except OSError:
            pass  # it died while it waited: collect() says how
        finally:
            if gate is not None:
                gate.spawned(self.spawned.proc.pid, self.spawned.marker)  # it holds the gate's end now (or is gone)
        try:
            return collect(self.spawned, job, self.timeout_s, on_message, since, keep=self.serving)
        finally:
            if self.spawned.collected:  # open till now: a lane's settle() may still wait for this worker's start-up
                self._close()

    def warm(self, timeout_s: float) -> bool:
        """Whether its start-up is over: it wrote job_channel.WARM (or ended, or was taken down); waits up to
        timeout_s for it, in short slices so that run() can close the socket meanwhile."""
        deadline = time.monotonic() + timeout_s
        while not self._warm.is_set():
            slice_s = max(0.0, min(0.05, deadline - time.monotonic()))
            with self._sock_lock:
                if not self._warm.is_set():
                    try:
                        heard = bool(select.select([self.sock], [], [], slice_s)[0])
                    except (OSError, ValueError):  # closed
                        heard = True
                    if heard:
                        try:
                            self.sock.recv(1)  # WARM, or b"" when the worker has closed its end (ended, or has its job)
                        except OSError:
                            pass
                        self.warm_at = time.monotonic()
                        self._warm.set()
            if time.monotonic() >= deadline:
                break
        return self._warm.is_set()

    def _close(self) -> None:
        with self._sock_lock:
            if self.warm_at is None:
                self.warm_at = time.monotonic()
            self._warm.set()  # nothing more to wait for
            self.sock.close()

    def abandon(self) -> None:
        """Not needed (or the evaluation ended otherwise): taken down, nothing sent."""
        self._close()
        self.spawned.abandon()


class Spares:
    """Candidate processes waiting for their candidates, up to `per_device` for each lane device, each started
    by a thread of its own that lives as long as the pool (a worker dies with the thread that started it:
    sandbox._die_with_parent). Started when top_up() asks: as the pool is made (its first evaluation, a run's
    starter, then runs in one too) and once a candidate's process has ended (its timed phase over). A start-up
    (seconds of CPU work, a GPU context made) never runs beside a timed phase: a lane's grant waits for those
    still starting for it (settle). (On the H200, an evaluation whose start two spares started beside took 25.2 s,
    slower in every phase, timing 6.3 s, than the 18.6-19.6 s, timing 3.7-4.9 s, of one cold and alone.)"""

    def __init__(self, template: Callable[[], Job], timeout_s: float, per_device: int):
        """template: a new scratch directory's job as far as it is known before its candidate (mode, device,
        task, timer), made afresh for each spare. Its judges are the pool's, serving one evaluation after
        another (judges.py JudgeService): a spare starts alone (each used to start its two judges with it)."""
        self.template, self.timeout_s, self.per_device = template, timeout_s, per_device
        self._ready: dict[Optional[str], list[WarmWorker]] = {}
        self._count: dict[Optional[str], int] = {}  # ready or starting, per device
        self._wanted: queue.Queue = queue.Queue()
        self._starting: dict[Optional[str], list[WarmWorker]] = {}  # per device: spares, taken or not, and
        # serving judges (track), whose start-up may not be over (settle)
        self._lock = threading.Lock()
        self._closed = False
        self.started = self.taken = 0  # for tests and bench/
        self._thread = threading.Thread(target=self._keep, name="optagent-spares", daemon=True)
        self._thread.start()

    def top_up(self, device: Optional[str]) -> None:
        """Start as many as `device`'s lane lacks."""
        with self._lock:
            lacking = 0 if self._closed else self.per_device - self._count.get(device, 0)
            self._count[device] = self._count.get(device, 0) + max(0, lacking)
        for _ in range(lacking):
            self._wanted.put(device)

    def _keep(self) -> None:
        while True:
            device = self._wanted.get()
            if self._closed:
                return
            worker = None
            try:
                job = self.template()
                try:
                    worker = WarmWorker(job, self.timeout_s, Control(device))
                except Exception:
                    remove_scratch(Path(job.scratch))
            except Exception:
                pass  # no spare this time: an evaluation starts its candidate process itself
            with self._lock:
                if worker is None or self._closed:
                    self._count[device] -= 1
                else:
                    self._ready.setdefault(device, []).append(worker)
                    self._starting.setdefault(device, []).append(worker)
                    self.started += 1
                    continue
            if worker is not None:
                _discard(worker)

    def track(self, device: Optional[str], worker: WarmWorker) -> None:
        """A process started for `device`'s lane besides the spares (a judge that serves evaluation after
        evaluation: judges.py JudgeService), whose start-up the lane waits for too (settle)."""
        with self._lock:
            self._starting.setdefault(device, []).append(worker)

    def settle(self, device: Optional[str], max_s: float) -> float:
        """Wait until no process started for `device`'s lane (a spare, taken or not, or a serving judge) is still
        starting, or max_s; the seconds waited. A lane calls it as it is granted (lanes.Lane.acquire): a
        start-up beside a timed phase is seconds of the host's cores and a GPU context made, and slowed the
        timing (on the H200 a re-time's two kernels, the second's spare still importing beside the first's
        timing: 20 of 32 loops timed again after a slow host, 2.8 s of timer loops a kernel against 1.4 s
        in an evaluation). Spares still waiting to be spawned are waited for too; a process that is still starting
        after a whole max_s is not waited for again (a hung start-up must not hold every grant)."""
        start = time.monotonic()
        deadline = start + max_s
        while True:
            with self._lock:
                queued = (self._count.get(device, 0) - len(self._ready.get(device, []))
                          if not self._closed else 0)  # asked for, not spawned yet; taken ones count no more
                listed = list(self._starting.get(device, []))
            workers = [w for w in listed if not w.warm(0)]
            left = deadline - time.monotonic()
            # not waited for again: the warm ones, and, once max_s is spent, those still starting (stuck, or the
            # host is)
            done = set(listed) if left <= 0 else set(listed) - set(workers)
            with self._lock:
                self._starting[device] = [w for w in self._starting.get(device, []) if w not in done]
            if (not workers and queued <= 0) or left <= 0:
                break
            if workers:
                workers[0].warm(left)
            else:
                time.sleep(min(0.05, left))
        return time.monotonic() - start

    def take(self, device: Optional[str]) -> Optional[WarmWorker]:
        """A spare for a candidate on `device`'s lane, or None (none is ready: the caller starts a process)."""
        with self._lock:
            ready = self._ready.get(device)
            if self._closed or not ready:
                return None
            worker = ready.pop(0)
            self._count[device] -= 1
            self.taken += 1
        if worker.spawned.proc.poll() is not None:  # it died while it waited (a limit, the host)
            _discard(worker)
            return None
        return worker

    def close(self) -> None:
        """The pool is done: the spares still waiting are taken down with their scratch directories."""
        with self._lock:
            self._closed = True
            waiting = [w for ready in self._ready.values() for w in ready]
            self._ready.clear()
        self._wanted.put(None)  # wakes the thread, which sees the pool closed
        for worker in waiting:
            _discard(worker)


def _discard(worker: WarmWorker) -> None:
    worker.abandon()
    remove_scratch(worker.scratch)
