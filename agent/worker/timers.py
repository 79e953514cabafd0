"""The harness's timers, worker side: the native one (worker/native/timer.c) and the Python fallback.

Both speak one protocol to candidate.py. ``eager(label, kind, fn, sets, after, n_keep)`` and
``gpu(label, fn, sets, capturable, after, n_keep, poison)`` return the statistics and
``check``: the timed calls, as (call number, input set, refresh seed), whose outputs must be
saved for the judge (some drawn at random, and each set's last). ``after(call, set, seed,
keep, drop)`` runs after every call, outside the timed window: it keeps that call's outputs
when ``keep`` (and forgets call ``drop``, no longer wanted), poisons the outputs and redraws
the set's inputs from ``seed``. With the native timer what is returned here is only the
harness's copy: the parent takes the timings and the calls to check from the timer's own
records (evaluation/timer_check.py), which never pass through Python.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import random
from types import ModuleType
from typing import Callable, Optional

import torch

from optagent.enums import TimerKind
from optagent.messages import Job, NativeTimerSpec
from optagent.native_copy import checked_copy
from optagent.schema import Device
from optagent.timer_records import LoopKind
from optagent.worker import bench, digests, host_speed, referee_client

NATIVE: Optional[ModuleType] = None  # set by the worker's main, before any candidate code exists
MODULE = "_optagent_timer"


def load_native(spec: NativeTimerSpec, job: Job, secret_fd: int, report_fd: int) -> ModuleType:
    """The parent's build, checked and loaded from a private copy (memfd): a file the candidate can
    write is read once, hashed, and never opened again."""
    with checked_copy(spec.path, spec.sha256, "optagent_timer") as copy:
        path = copy or spec.path  # no memory file: the path itself, just checked
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        found = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        assert found is not None
        module = importlib.util.module_from_spec(found)
        loader.exec_module(module)
    t = job.timing
    module.init(secret_fd, report_fd, job.device is Device.CUDA, t.min_iters, t.max_iters, t.warmup, t.budget_s)
    # the machine's usual speed, not this process's fastest: one slow from its start would call its slowness usual
    # (on the H200 decode Triton's first three cases read 20% slow in one evaluation of four: docs/gpu.md, 2026-12-03)
    module.machine_usual(host_speed.usual_probe_us(module.usual_probe_us(), TimerKind.NATIVE))
    if referee_client.fds() is not None:  # each timed call bracketed for the referee's clock
        module.referee(*referee_client.fds())
    return module


def make_timer(job: Job) -> "NativeTimer | PythonTimer":
    return NativeTimer(NATIVE, job) if NATIVE is not None else PythonTimer(job)


class NativeTimer:
    kind = TimerKind.NATIVE

    def __init__(self, module: ModuleType, job: Job):
        self.mod, self.device = module, job.device
        self._waits = host_speed.WaitBudget(bench.HOST_WAIT_S, bench.HOST_WAIT_TOTAL_S)
        self._sessions: dict[tuple[str, bool], object] = {}
        if job.device is Device.CUDA:
            torch.empty(1, device="cuda")  # the primary context exists and is current on this thread
            module.cuda_setup()
            digests.use_native(module.digest)  # the after-work's digests in one pass (native/digest.cu)

    def _session(self, label: str, baseline: bool, n_sets: int, n_keep: int):
        # one per case and callable: the sets' refresh seeds carry over from the eager loop to the GPU one
        key = (label, baseline)
        if key not in self._sessions:
            self._sessions[key] = self.mod.session(label, n_sets, n_keep)
        return self._sessions[key]

    def eager(self, label: str, kind: LoopKind, fn: Callable, sets: list[list], after: Optional[Callable] = None,
              n_keep: int = 0, on_loop: Optional[Callable[[list], None]] = None) -> dict:
        """on_loop hears each loop's kept calls as the loop ends (a slow host's retry is a second loop)."""
        session = self._session(label, kind is LoopKind.BASELINE, len(sets), n_keep)
        with bench.no_gc():
            result = session.eager(kind.value, fn, sets, after)
            check = list(result["check"])
            if on_loop is not None:  # this loop's kept calls saved now: the retry's calls replace the latest ones
                on_loop(result["check"])
            if result["host_slow"] and self.device is Device.CUDA and self._waits.wait(self.mod.wait_for_usual):
                again = session.eager(kind.value, fn, sets, after)  # the retry's calls are checked alike
                if on_loop is not None:
                    on_loop(again["check"])
                check += again["check"]
                result = min(result, again, key=lambda r: (r["host_slow"], r["median_us"]))
        return {**result, "check": [] if on_loop is not None else check}

    def gpu(self, label: str, fn: Callable, sets: list[list], capturable: bool, after: Optional[Callable],
            n_keep: int, poison: Callable[[], None]) -> tuple[Optional[dict], Optional[str]]:
        """GPU time of graph replays (or of the call, between events), each replay checked like a call."""
        if self.device is not Device.CUDA:
            return None, "no GPU"
        note = None
        with bench.no_gc():
            if capturable:
                graphs, note = bench.capture_graphs(fn, sets)
                if graphs is None:
                    return None, note

                def launch(i: int) -> None:
                    graphs[i % len(graphs)].replay()
            else:
                note = "events around the call (not capturable in a CUDA graph)"

                def launch(i: int) -> None:
                    fn(*sets[i % len(sets)])
            poison()  # the capture's warm-up answers must not pass for a replay's
            return self._session(label, False, len(sets), n_keep).replay(launch, after), note


class PythonTimer:
    """bench.Timer (in-process Python: a candidate can rewrite it), behind the same protocol."""

    kind = TimerKind.PYTHON

    def __init__(self, job: Job):
        t = job.timing
        self.timer = bench.Timer(job.device, t.min_iters, t.max_iters, t.budget_s, t.warmup)
        self.rng = random.Random()  # not the job's seed: the kernel cannot predict which calls are checked
        self.calls = 0

    def eager(self, label: str, kind: LoopKind, fn: Callable, sets: list[list], after: Optional[Callable] = None,
              n_keep: int = 0, on_loop: Optional[Callable[[list], None]] = None) -> dict:
        """on_loop is not called: this timer tells its kept calls at the end, under "check"."""
        if after is None:
            return {**self.timer.eager(fn, sets), "check": []}
        n, seeds = len(sets), [None] * len(sets)
        kept: list[tuple] = []
        last: dict[int, tuple] = {}
        seen = 0

        def each(i: int, args: list) -> None:
            nonlocal seen
            k, keep, drop, call = (i % n if i >= 0 else (-1 - i) % n), False, -1, i
            if i >= 0:  # numbered across both tries of a slow host, never by the loop index
                self.calls += 1
                seen += 1
                call = self.calls
                last[k] = entry = (call, k, seeds[k])
                if len(kept) < n_keep:
                    kept.append(entry)
                    keep = True
                elif self.rng.random() < n_keep / seen:  # reservoir sampling over all timed calls
                    j = self.rng.randrange(n_keep)
                    drop, kept[j], keep = kept[j][0], entry, True
            seeds[k] = self.rng.getrandbits(40)
            after(call, k, seeds[k], keep, drop)

        result = self.timer.eager(fn, sets, after=each)
        return {**result, "check": kept + [c for c in last.values() if c not in kept]}

    def gpu(self, label: str, fn: Callable, sets: list[list], capturable: bool, after: Optional[Callable],
            n_keep: int, poison: Callable[[], None]) -> tuple[Optional[dict], Optional[str]]:
        timing, note = self.timer.gpu(fn, sets, capturable=capturable)
        return ({**timing, "check": []} if timing else None), note
