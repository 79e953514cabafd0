"""The evaluation pool on a Ray cluster (--cluster ray): the timing lanes are actors, one a GPU, on any node.

The same Pool as the local one (pool.py) to the loop. Each actor (ray_lane.py) evaluates in the same
sandboxed processes as a local run, on its own node, and times its baselines once; the orchestrator
sends jobs and hears back progress and results as typed records, and alone writes the run store.
A round's jobs go to the actors with free places (each takes as many at once as its local pool would);
a re-time is pinned to the actor that timed the incumbent, so that the comparison deciding acceptance
is made on one GPU, back to back, never across nodes.

Faults: a call whose actor, worker or node is lost (ray_cluster.LOST) is queued again on a fresh actor
in its slot, and its job is yielded once, whatever happened before (a job lost MAX_TRIES times is
recorded as a failure, so that a job that kills its node cannot stall the run). An actor whose health
check fails, when it starts or after a result that names a device fault (its context may be poisoned),
is replaced, and that result is not trusted: the job runs again on the fresh actor.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import ray

from optagent.evaluation.ray_cluster import LOST, ClusterError, actor_env, connect, cpu_lanes, gpu_lanes, where
from optagent.evaluation.ray_lane import (Builder, Health, LaneActor, LaneEvent, LaneInfo, LaneSpec, RemoteJob,
                                         device_trouble, lost_result)
from optagent.progress import ProgressSink
from optagent.protocols import PoolJob
from optagent.schema import Device, EvalResult, Isolation

MAX_TRIES = 3  # a job's evaluations lost with their actor before it is recorded as failed
MAX_STARTS = 3  # actors a slot may start in a row that fail their health check before the slot is given up
START_S = 600.0  # an actor not ready by then (its node gone, no GPU free) is given up and started again
SETTLE_S = 120.0  # the pool starts work once an actor is ready and the others have had this long
TICK_S = 1.0
CONCURRENCY = 64  # threads of one actor: its evaluations, re-times, stops and checks
# A device fault, not the kernel's: after a result that says one, the actor checks its GPU in a fresh process.
DEVICE_FAULT = re.compile(r"CUDA error|CUDA_ERROR_|cudaError|illegal memory access|unspecified launch failure|"
                          r"uncorrectable ECC|device-side assert|CUBLAS_STATUS_EXECUTION_FAILED", re.I)


@dataclass
class Slot:
    """A lane: its current actor, replaced in place when lost or sick."""

    index: int
    actor: Any
    ready: Any  # the pending ready() call while the actor starts, else None
    since: float
    info: Optional[LaneInfo] = None
    busy: int = 0
    starts: int = 1  # actors started in a row without one becoming healthy


@dataclass
class Flight:
    """One call to an actor: a job's evaluation, or a re-time batch (pinned to one slot)."""

    jobs: list[PoolJob]
    pinned: Optional[int] = None  # a re-time's slot
    tries: int = 0
    slot: Optional[Slot] = None
    token: str = ""
    results: list[EvalResult] = field(default_factory=list)


class RayPool:
    def __init__(self, spec: LaneSpec, package: bytes, build: Builder, *, address: Optional[str] = None,
                 lanes: Optional[int] = None, health: Health = device_trouble):
        """package: pack_task's archive; build: makes an actor's local pool (cli/build.py); health: the
        actors' device check (worker/health.py in a fresh process)."""
        self.spec, self.address = spec, address
        count = lanes or (cpu_lanes() if spec.device is Device.CPU else None)
        self._owns_ray = connect(address, cpus=count or 1)
        count = count or gpu_lanes(address)
        self._remote = ray.remote(LaneActor)
        self._args = (spec.model_dump_json(), ray.put(package), build, health)
        self.slots: dict[int, Slot] = {}
        self.replaced = 0  # actors replaced, lost or sick
        self.requeued = 0  # calls queued again after their actor was lost or found sick
        self.timed_on: dict[int, int] = {}  # job key -> the slot whose actor timed it last
        for i in range(count):
            self.slots[i] = self._start(i)
        self._settle()

    @property
    def lanes(self) -> int:
        return len(self.slots)

    @property
    def planned_isolation(self) -> Isolation:
        """The first actor's (each result records its own node's)."""
        return next(s.info.isolation for s in self.slots.values() if s.info)

    def evaluate(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None
                 ) -> Iterator[tuple[PoolJob, EvalResult]]:
        for flight in self._run([Flight([job]) for job in jobs], progress):
            yield flight.jobs[0], flight.results[0]

    def retime(self, jobs: Sequence[PoolJob], progress: Optional[ProgressSink] = None) -> list[EvalResult]:
        pinned = self.timed_on.get(jobs[0].key)
        if pinned not in self.slots:
            pinned = min(self.slots)
        [flight] = list(self._run([Flight(list(jobs), pinned=pinned)], progress))
        return flight.results

    def baseline_runs(self) -> dict[int, int]:
        """Baseline jobs each live actor ran (once per actor while its host holds still)."""
        return {i: ray.get(s.actor.baseline_runs.remote()) for i, s in self.slots.items() if s.info}

    def close(self) -> None:
        for slot in self.slots.values():
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # gone with its node
                pass
        self.slots = {}
        if self._owns_ray:
            ray.shutdown()

    # ------------------------------------------------------------------ the actors

    def _start(self, index: int) -> Slot:
        opts: dict = dict(num_gpus=1, num_cpus=0) if self.spec.device is Device.CUDA else dict(num_cpus=1)
        env = actor_env()
        if env:
            opts["runtime_env"] = {"env_vars": env}
        actor = self._remote.options(name=f"optagent-lane{index}-{uuid.uuid4().hex[:8]}", max_restarts=0,
                                     max_concurrency=CONCURRENCY, **opts).remote(*self._args)
        return Slot(index, actor, actor.ready.remote(), time.monotonic())

    def _restart(self, slot: Slot, why: str, healthy_before: bool) -> None:
        """A fresh actor in the slot; one that never became healthy MAX_STARTS times is given up."""
        self.replaced += 1
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # already gone with its node
            pass
        starts = 1 if healthy_before else slot.starts + 1
        if starts > MAX_STARTS:
            del self.slots[slot.index]
            if not self.slots:
                raise ClusterError(f"{where(self.address)}: no lane actor is left: {why}")
            return
        fresh = self._start(slot.index)
        fresh.starts = starts
        self.slots[slot.index] = fresh

    def _started(self, slot: Slot) -> None:
        try:
            info = LaneInfo.model_validate_json(ray.get(slot.ready))
        except LOST as e:
            slot.ready = None
            self._restart(slot, f"the actor was lost as it started: {type(e).__name__}", False)
            return
        slot.ready = None
        if info.broken:  # a setting or the package, not the GPU: another actor would fail the same way
            raise ClusterError(f"{where(self.address)}: the lane actor on {info.node} cannot evaluate: {info.broken}")
        if info.sick:
            self._restart(slot, f"{info.node}: {info.sick}", False)
        else:
            slot.info, slot.starts = info, 0

    def _settle(self) -> None:
        """Until every slot's actor is ready, or SETTLE_S have passed with one ready (the others join when they
        are: a GPU another job holds); in the constructor, so a bad setting and the isolation line come first."""
        t0 = time.monotonic()
        while (starting := self._starting()) and (len(starting) == len(self.slots) or time.monotonic() - t0 < SETTLE_S):
            ready, _ = ray.wait(list(starting), num_returns=1, timeout=TICK_S)
            for ref in ready:
                self._started(starting[ref])
            self._expire()

    def _starting(self) -> dict:
        return {s.ready: s for s in self.slots.values() if s.ready is not None}

    def _expire(self) -> None:
        for slot in list(self.slots.values()):
            if slot.ready is not None and time.monotonic() - slot.since > START_S:
                self._restart(slot, f"its actor was not ready after {START_S:g} s", False)

    # ------------------------------------------------------------------ the calls

    def _run(self, flights: list[Flight], sink: Optional[ProgressSink]) -> Iterator[Flight]:
        todo, done = deque(flights), deque()
        flying: dict[Any, Flight] = {}  # a call's answer stream (or its health check) -> the call
        try:
            while todo or flying or done:
                while done:
                    yield done.popleft()
                if not (todo or flying):
                    break
                self._dispatch(todo, flying)
                starting = self._starting()
                waitable = list(flying) + list(starting)
                if not waitable:
                    raise ClusterError(f"{where(self.address)}: no lane actor can take the work")
                ready, _ = ray.wait(waitable, num_returns=1, timeout=TICK_S)
                for ref in ready:
                    if ref in starting:
                        self._started(starting[ref])
                    elif ref in flying:
                        self._heard(ref, flying.pop(ref), flying, todo, done, sink)
                self._expire()
        finally:  # the caller stopped early (Ctrl-C, an error): no evaluation of this call outlives it
            for flight in flying.values():
                if flight.slot is not None and flight.slot.index in self.slots:
                    flight.slot.actor.stop.remote(flight.token)

    def _dispatch(self, todo: deque, flying: dict) -> None:
        for flight in list(todo):
            slot = self._slot_for(flight)
            if slot is None:
                continue
            todo.remove(flight)
            flight.slot, flight.token = slot, uuid.uuid4().hex
            slot.busy += 1
            streaming = dict(num_returns="streaming")
            if flight.pinned is not None:
                stream = slot.actor.retime.options(**streaming).remote(flight.token, [RemoteJob.of(j) for j in flight.jobs])
            else:
                stream = slot.actor.evaluate.options(**streaming).remote(flight.token, RemoteJob.of(flight.jobs[0]))
            flying[stream] = flight

    def _slot_for(self, flight: Flight) -> Optional[Slot]:
        if flight.pinned is not None:
            slot = self.slots.get(flight.pinned)
            if slot is None or not slot.info:  # not the actor that timed the incumbent any more: any one will do,
                ready = [s for s in self.slots.values() if s.info]  # still back to back on one GPU
                slot = min(ready, key=lambda s: s.index) if ready else None
                flight.pinned = slot.index if slot else flight.pinned
            return slot
        free = [s for s in self.slots.values() if s.info and s.busy < s.info.jobs]
        return min(free, key=lambda s: (s.busy, s.index)) if free else None

    def _heard(self, ref, flight: Flight, flying: dict, todo: deque, done: deque,
               sink: Optional[ProgressSink]) -> None:
        slot = flight.slot
        if flight.results:  # the answer was a device fault's: this is the health check's
            try:
                why = ray.get(ref)
            except LOST as e:
                why = f"lost during its health check: {type(e).__name__}"
            if why:
                return self._lose(slot, f"{slot.info.node}: {why}", flight, flying, todo, done, healthy=True)
            return self._finish(flight, done)
        try:
            event = LaneEvent.model_validate_json(ray.get(next(ref)))
        except StopIteration:
            return self._lose(slot, "its answer ended without a result", flight, flying, todo, done, healthy=True)
        except LOST as e:
            return self._lose(slot, type(e).__name__, flight, flying, todo, done, healthy=True)
        if event.progress is not None:
            flying[ref] = flight
            if sink is not None:
                sink(event.progress)
            return
        if event.error is not None:
            raise RuntimeError(f"lane {slot.index} on {slot.info.node}: {event.error}")
        flight.results = list(event.results or [])
        if any(not r.status.ok and DEVICE_FAULT.search(r.reason or "") for r in flight.results):
            flying[slot.actor.check.remote()] = flight
            return
        self._finish(flight, done)

    def _finish(self, flight: Flight, done: deque) -> None:
        slot, info = flight.slot, flight.slot.info  # an actor is one GPU for its life: a replacement is another lane
        lane = f"lane {slot.index} on {info.node} (actor pid {info.pid})" if info else f"lane {slot.index}"
        flight.results = [r.model_copy(update={"timed_on": lane}) for r in flight.results]
        slot.busy -= 1
        for job in flight.jobs:
            self.timed_on[job.key] = slot.index
        done.append(flight)

    def _lose(self, slot: Slot, why: str, flight: Flight, flying: dict, todo: deque, done: deque,
              healthy: bool) -> None:
        """The slot's actor is lost or sick: every call on it is queued again (this one first), a fresh actor
        takes its place."""
        again = [flight] + [f for f in flying.values() if f.slot is slot]
        for ref in [r for r, f in flying.items() if f.slot is slot]:
            del flying[ref]
        self._restart(slot, why, healthy)
        for f in reversed(again):
            f.tries, f.slot, f.results = f.tries + 1, None, []
            self.requeued += 1
            if f.tries >= MAX_TRIES:
                f.results = [lost_result(job, self.spec.device, why, f.tries) for job in f.jobs]
                done.append(f)
            else:
                todo.appendleft(f)

