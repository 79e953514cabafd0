"""A timing lane on a Ray cluster, the actor's side: one actor a GPU, evaluating as the local pool does.

The actor holds a local pool of one lane (its GPU: Ray sets CUDA_VISIBLE_DEVICES for an actor with
num_gpus=1) over the same SandboxEvaluator a local run uses, so every candidate runs in the same
sandboxed candidate and judge processes, on the actor's node, under that node's isolation; never in
the actor's own process. The lane's baselines are timed once per actor, as once per lane locally.

What crosses the cluster is data, not live objects: the task package as a tar archive (put once in
the object store, unpacked on each node and checked against the run's digest), jobs and results as
the typed records' JSON. The actor writes nothing of the run: the orchestrator alone writes the store.
Its answers stream (a Ray streaming generator): progress events as they happen, then the results.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from pydantic import Field

from optagent.cache import cache_root
from optagent.messages import CaseSpec
from optagent.progress import Progress
from optagent.protocols import PoolJob
from optagent.schema import Device, EvalResult, Isolation, Language, Record, Status
from optagent.task import TaskError, load_task

if TYPE_CHECKING:
    from optagent.evaluation.pool import LocalPool

HEALTH_TIMEOUT_S = 180.0  # torch's import and a CUDA context: seconds on a healthy node, never minutes


class LaneSpec(Record):
    """What an actor builds its evaluator from: the run's settings, as the orchestrator built its own."""

    task_name: str  # the package directory's name
    task_digest: str
    device: Device
    cases: list[CaseSpec]
    timeout_s: float
    compiler: Optional[list[str]] = None
    profile: bool = False  # --profile: passing kernels also profiled under ncu, on the actor's node
    target_facts: bool = False  # CPU mode: Triton kernels also compiled for the target GPU (compiler_facts.py)
    jobs: Optional[int] = None  # evaluations at once on the actor (None: the local pool's default for one lane)


class RemoteJob(Record):
    key: int
    source: str
    language: Language

    def pool_job(self) -> PoolJob:
        return PoolJob(self.key, self.source, self.language)

    @staticmethod
    def of(job: PoolJob) -> str:
        return RemoteJob(key=job.key, source=job.source, language=job.language).model_dump_json()


class LaneInfo(Record):
    """An actor's answer to ready(): where it runs and whether it can take work."""

    node: str
    pid: int
    jobs: int = 0
    isolation: Isolation = Field(default_factory=Isolation)
    broken: Optional[str] = None  # its evaluator could not be built there (a setting, the package): not a GPU fault
    sick: Optional[str] = None  # its health check failed: the actor is replaced


class LaneEvent(Record):
    """One item of an actor's answer stream: a progress event, the results (the last item), or an error."""

    progress: Optional[Progress] = None
    results: Optional[list[EvalResult]] = None
    error: Optional[str] = None


Builder = Callable[[LaneSpec, Path], "LocalPool"]
Health = Callable[[Device], Optional[str]]


def lost_result(job: PoolJob, device: Device, why: str, tries: int) -> EvalResult:
    """The record of a job whose evaluation was lost with its actor every time it was tried."""
    return EvalResult(status=Status.RUNTIME_ERROR, language=job.language, device=device, wall_s=0.0,
                      source_sha256=hashlib.sha256(job.source.encode()).hexdigest(),
                      reason=f"the evaluation was lost with its Ray actor {tries} times (last: {why})")


def pack_task(root: Path) -> bytes:
    """The package as the digest sees it (every file but __pycache__), under its directory's name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=True) as tar:
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                tar.add(p, arcname=f"{root.name}/{p.relative_to(root).as_posix()}", recursive=False)
    return buf.getvalue()


def unpack_task(blob: bytes, spec: LaneSpec) -> Path:
    """The package on this node, unpacked once per digest (actors of one node share it), checked whole."""
    home = cache_root() / "ray-tasks" / spec.task_digest[:24]
    root = home / spec.task_name
    if not root.is_dir():
        home.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=home))
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                if hasattr(tarfile, "data_filter"):  # no absolute paths, links out or devices
                    tar.extractall(tmp, filter="data")
                else:
                    tar.extractall(tmp)
            try:
                os.rename(tmp / spec.task_name, root)
            except OSError:  # another actor of this node unpacked it first
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    got = load_task(root).digest()
    if got != spec.task_digest:
        raise TaskError(root, f"the unpacked package's digest {got[:12]} is not the run's {spec.task_digest[:12]}")
    return root


def device_trouble(device: Device) -> Optional[str]:
    """None when the device works (worker/health.py in a process of its own), else why not, one line."""
    try:
        out = subprocess.run([sys.executable, "-m", "optagent.worker.health", device.value], capture_output=True,
                             text=True, timeout=HEALTH_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"the health check took over {HEALTH_TIMEOUT_S:g} s"
    except OSError as e:
        return f"the health check did not start: {e}"
    if out.returncode == 0:
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return f"the health check failed: {lines[-1] if lines else f'exit code {out.returncode}'}"


class LaneActor:
    """Wrapped by ray.remote in ray_pool.py (this module needs no Ray). Threaded: several evaluations
    at once (their timed phases take turns on the one lane), and stop calls beside them."""

    def __init__(self, spec_json: str, package: bytes, build: Builder, health: Health):
        self.spec = LaneSpec.model_validate_json(spec_json)
        self.package, self.build, self.health = package, build, health
        self.pool: Optional[LocalPool] = None
        self._stops: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def ready(self) -> str:
        """Unpacks the package, builds the evaluator and checks the device; a LaneInfo's JSON."""
        info = LaneInfo(node=os.uname().nodename, pid=os.getpid())
        try:
            self.pool = self.build(self.spec, unpack_task(self.package, self.spec))
        except Exception as e:  # a bad setting or package on this node: said, not raised (the caller decides)
            return info.model_copy(update={"broken": f"{type(e).__name__}: {e}"}).model_dump_json()
        return info.model_copy(update={"jobs": self.pool.jobs, "isolation": self.pool.planned_isolation,
                                       "sick": self.health(self.spec.device)}).model_dump_json()

    def check(self) -> Optional[str]:
        """The health check again (after a result that names a device fault): None when healthy."""
        return self.health(self.spec.device)

    def baseline_runs(self) -> int:
        return self.pool.baseline_runs if self.pool else 0

    def evaluate(self, token: str, job_json: str) -> Iterator[str]:
        job = RemoteJob.model_validate_json(job_json).pool_job()
        yield from self._stream(token, lambda sink, stop: [r for _, r in self.pool.evaluate([job], sink, stop)])

    def retime(self, token: str, jobs_json: list[str]) -> Iterator[str]:
        jobs = [RemoteJob.model_validate_json(j).pool_job() for j in jobs_json]
        yield from self._stream(token, lambda sink, stop: self.pool.retime(jobs, sink, stop))

    def stop(self, token: str) -> None:
        """The caller gave up on a call (Ctrl-C, an early close): its worker processes are killed."""
        with self._lock:
            event = self._stops.get(token)
        if event is not None:
            event.set()

    def _stream(self, token: str, work: Callable[..., list[EvalResult]]) -> Iterator[str]:
        """`work` runs in a thread of its own; its progress events and then its results come out in order."""
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        with self._lock:
            self._stops[token] = stop

        def run() -> None:
            try:
                out.put(LaneEvent(results=work(out.put, stop)))
            except BaseException as e:  # the pool's own failure: the caller raises it
                out.put(LaneEvent(error=f"{type(e).__name__}: {e}"))
        threading.Thread(target=run, name="optagent-lane-call", daemon=True).start()
        try:
            while True:
                item = out.get()
                event = LaneEvent(progress=item) if isinstance(item, Progress) else item
                yield event.model_dump_json()
                if event.progress is None:
                    return
        finally:
            stop.set()
            with self._lock:
                self._stops.pop(token, None)
