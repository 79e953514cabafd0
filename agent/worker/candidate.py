"""The candidate process (untrusted): baseline first, then the kernel, case by case.

The baseline is timed before any candidate code exists in the process (or, in a pool,
once per lane in a process of its own: the baseline job). Then the process is locked
down (import blocker, audit guard) and, per case, a fresh copy of the kernel runs on
the package's inputs and on fresh ones (outputs poisoned, in/out tensors fresh copies of the package's
contents, read-only inputs compared bitwise);
once every case passed its checks, the timed cases are timed in one hold of the timing
lane (worker/lane.py), with inputs redrawn and outputs re-poisoned after every call. Every output the judge will check is saved with
the seeds that rebuild its inputs and a digest that proves it was not rewritten (worker/sample_file.py).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from optagent.worker import bench, compiler_facts, referee_client, sample_file, target_compile, tasks
from optagent.worker.backends import CompileError, Refused, Unsupported, backend_for
from optagent.worker.guard import lock_imports, watch_host_compute
from optagent.worker.interpreter_faults import repair_interpreter
from optagent.worker.after_work import AfterWork, out_bytes
from optagent.worker.args import clone_args
from optagent.worker.case_store import CaseStore
from optagent.worker.compare import fails_check
from optagent.worker.digests import checksum
from optagent.worker.harness import TaskRuntime, poison, run_baseline, same_bits
from optagent.worker import lane as lane_clock
from optagent.worker.lane import lane
from optagent.messages import (Baseline, CaseFailed, CaseRan, CaseSpec, CaseStart, Channel, Compiled, Done, Hello,
                               Integrity, Job, Phase, PhaseStarted, Sample)
from optagent.schema import CaseKind, Device, Language, Status, Timing
from optagent.timer_records import LoopKind, checked_seeds, set_seed, timed_name
from optagent.worker.timers import make_timer

SAMPLED_CALLS = 4  # timed calls, drawn at random, whose outputs the judge checks besides each set's last
# Fewer drawn calls where outputs are huge (a 16k-token prefill writes 1 GiB per call): each
# one is saved, hashed and checked against a float64 reference, seconds apiece.
SAMPLED_BYTES = 1 << 30


def _threads() -> set[int]:
    # sys._current_frames sees threads started with _thread too, not only threading's.
    return set(sys._current_frames())


# The load time's clock, bound at import: a candidate that patches bench's clock (and is rejected for
# it at the end) must not break the harness's own bookkeeping first. Timings use the native timer.
_load_clock = time.perf_counter


class Candidate:
    def __init__(self, job: Job, chan: Channel):
        self.job, self.chan = job, chan
        self.rt = TaskRuntime(job.task_dir, job.device)
        if job.stored_cases:  # the baseline job keeps slow cases for later processes; a candidate only reads them
            self.rt.store = CaseStore(self.rt.task, self.rt.device, write=job.mode == "baseline")
        self.timer = make_timer(job)  # the native one where the parent built it (worker/timers.py)
        self.sync = torch.cuda.synchronize if job.device is Device.CUDA else (lambda: None)
        self.out_dir = Path(job.outputs_dir or job.scratch)
        self.wrong = False  # check() failed a case's output here (_checked_runs): nothing is timed

    def run(self) -> None:
        """Baselines (unless the pool times them once per lane), compile, every case run and
        checked, then every timed case timed in one hold of the timing lane (worker/lane.py)."""
        job, chan = self.job, self.chan
        self._hello()
        if job.time_baseline:
            with lane(chan, Phase.BASELINE):  # before any candidate code exists in the process
                self._baselines()
        backend = backend_for(job.language, job.device, job.compiler, job.compile_timeout_s)
        if job.device is Device.CPU and job.language is Language.TRITON:
            repair_interpreter()  # the interpreter's own faults, mended before any candidate code exists
            if job.target_facts:
                target_compile.record_launches()  # the launches, to compile for the target GPU (self._facts)
        # The harness's heap (torch's and Triton's imports: ~190k objects) out of the collector's reach: the
        # backend collects after dropping each case's module (backends/python.py release), and a full pass
        # over that heap took 93 ms on the H200, 28 times a decode candidate. The candidate's own objects,
        # all made after this, are collected as before.
        gc.freeze()
        if job.guard:
            lock_imports(report=lambda why: chan.send(Integrity(reason=why)))
        chan.send(PhaseStarted(phase=Phase.COMPILING))
        try:
            backend.prepare(Path(job.source_path), Path(job.scratch))
        except (CompileError, Unsupported, Refused) as e:
            status = {Unsupported: Status.UNSUPPORTED, Refused: Status.REJECTED}.get(type(e), Status.COMPILE_ERROR)
            chan.send(Compiled(status=status, reason=str(e)))
            return
        chan.send(Compiled(status=Status.PASSED))
        threads = (_threads(), tasks.native_threads())  # Python's view, and the kernel's (worker/tasks.py)
        # the correctness runs hold the lane shared (on a GPU): never beside another process's timed phase
        shared = lane(chan, Phase.CASE) if job.shared_checks and not job.retime else contextlib.nullcontext()
        with shared:
            checked = self._correctness(backend, threads)
        if checked is None:
            return
        if checked:
            with lane(chan, Phase.TIMING):  # every case checked: only now is the lane worth taking
                for n, case, samples, load_ms in checked:
                    chan.send(PhaseStarted(phase=Phase.TIMING, case=case.label))
                    try:  # a fresh copy again: loading the next case dropped the checked one's module
                        fn = backend.load_fresh(f"{n}_{case.label}_timed")
                    except (CompileError, Unsupported) as e:
                        status = Status.UNSUPPORTED if isinstance(e, Unsupported) else Status.COMPILE_ERROR
                        chan.send(CaseFailed(case=case.label, status=status, reason=str(e)))
                        return
                    timed, timings = self._timed(case, fn, backend)
                    chan.send(CaseRan(case=case.label, samples=samples + timed, load_ms=load_ms,
                                      kernels=self._facts(backend), **timings))
                    if not self._no_new_threads(threads):
                        return
        patched = bench.patched_timers()
        if patched:
            chan.send(Integrity(reason=f"patched the harness's timers ({', '.join(patched)})"))
        chan.send(Done())

    def _correctness(self, backend, threads: tuple) -> Optional[list[tuple]]:
        """Each case loaded, run and checked ((n, case, samples, load_ms) of those to time); None where the
        evaluation has ended (a case's verdict said; or check() failed one, self.wrong, and Done said)."""
        job, chan = self.job, self.chan
        checked = []  # (n, case, samples, load_ms) of the cases still to time
        for n, case in enumerate(job.cases):
            chan.send(CaseStart(case=case.label))
            if job.retime:  # timing only (messages.Job.retime): the timed cases go straight to the timing phase
                if case.kind is CaseKind.HIDDEN:
                    chan.send(CaseRan(case=case.label, samples=[], load_ms=0.0))
                else:
                    checked.append((n, case, [], 0.0))
                continue
            t0 = _load_clock()
            try:
                fn = backend.load_fresh(f"{n}_{case.label}")
            except (CompileError, Unsupported) as e:
                status = Status.UNSUPPORTED if isinstance(e, Unsupported) else Status.COMPILE_ERROR
                chan.send(CaseFailed(case=case.label, status=status, reason=str(e), kernels=self._facts(backend)))
                return None
            load_ms = (_load_clock() - t0) * 1e3
            samples = self._checked_runs(n, case, fn)
            if samples is None or not self._no_new_threads(threads):
                return None
            if self.wrong:  # the verdict is INCORRECT whatever the rest does: no case is timed
                chan.send(CaseRan(case=case.label, samples=samples, load_ms=load_ms, kernels=self._facts(backend),
                                  untimed=True))
                chan.send(Done())
                return None
            if case.kind is CaseKind.HIDDEN:
                chan.send(CaseRan(case=case.label, samples=samples, load_ms=load_ms, kernels=self._facts(backend)))
            else:
                checked.append((n, case, samples, load_ms))
        return checked

    def run_baselines(self) -> None:
        """The baseline job: the baselines alone, timed in the lane; no candidate code in this process."""
        self._hello()
        with lane(self.chan, Phase.BASELINE):
            self._baselines()
        self.chan.send(Done())

    def _hello(self) -> None:
        job, rt = self.job, self.rt
        facts = bench.gpu_facts() if job.device is Device.CUDA else None
        name = torch.cuda.get_device_name(0) if job.device is Device.CUDA else Device.CPU.value
        self.chan.send(Hello(baseline_label=rt.baseline_label, device_name=name, gpu=facts,
                             import_s=time.monotonic() - lane_clock.STARTED))

    def _no_new_threads(self, before: tuple[set[int], set[int]]) -> bool:
        self.sync()
        python, native = before
        if _threads() - python:
            self.chan.send(Integrity(reason="left background threads running after run_kernel returned"))
            return False
        busy = tasks.busy_new_threads(native)
        if busy:
            self.chan.send(Integrity(reason=f"left {len(busy)} native thread(s) running after run_kernel returned "
                                            f"(busy on a CPU through a {tasks.WINDOW_S * 1e3:.0f} ms window)"))
            return False
        return True

    def _facts(self, backend) -> list:
        """What the compiler says of the kernels: as they ran on the GPU; on a CPU, as built for the target."""
        if self.job.device is Device.CUDA:
            return compiler_facts.collect(backend)
        if self.job.language is Language.TRITON:
            return target_compile.target_facts() if self.job.target_facts else []
        return [k.model_copy(update={"target": f"sm_{compiler_facts.TARGET_ARCH}"})
                for k in getattr(backend, "kernel_facts", [])]  # CUDA's sm_90 build (backends/cuda.py)

    def _baselines(self) -> None:
        rt, t = self.rt, self.job.timing

        def baseline(*args):
            run_baseline(rt.config, list(args))

        for case in (c for c in self.job.cases if c.kind is not CaseKind.HIDDEN):
            self.chan.send(PhaseStarted(phase=Phase.BASELINE, case=case.label))
            sets = [rt.make_args(case, set_seed(self.job, k))[0] for k in range(t.input_sets)]
            sizes = rt.describe(sets[0])
            # the candidate's after-work, here too: its interval is the reference for the candidate's
            work = AfterWork(sets, rt.outputs(sets[0]), rt.roles(sets[0]).inouts)
            work.poison_all()
            with referee_client.timed_loop(case.label, True, len(sets), 0):
                timing = self.timer.eager(case.label, LoopKind.BASELINE, baseline, sets, work)
            timing.pop("check")
            work.clear()
            self.chan.send(Baseline(case=case.label, timing=timing, sizes=sizes))
            del sets
        self.sync()

    def _save(self, label: str, name: str, outputs: dict, base_seed, refresh_seed, inputs=None) -> Sample:
        """Outputs (and, for the checked runs, the post-call inputs' checksums the judge compares with its own)."""
        path = self.out_dir / f"{label}-{name}.pt"
        sums = {i: checksum(t) for i, t in inputs.items()} if inputs is not None else None
        return Sample(name=name, base_seed=base_seed, refresh_seed=refresh_seed, file=str(path),
                      sha256=sample_file.write(path, outputs, sums))

    def _checked_runs(self, n: int, case: CaseSpec, fn) -> list[Sample] | None:
        """The package's own inputs, then fresh ones; None when the case already has its verdict."""
        rt, job, samples = self.rt, self.job, []
        for name, base_seed in checked_seeds(job, n, case):
            args, sizes = rt.make_args(case, base_seed)  # in/out tensors: a fresh copy of the package's contents
            roles = rt.roles(args)
            outs = roles.written
            # the contest's check() on the package's inputs (as the judge rebuilds them), after the call: a
            # kernel it fails is never timed
            before = clone_args(args) if name == "given" and case.kind is CaseKind.CONTEST else None
            for i in roles.outputs:
                poison(args[i])
            pristine = {i: a.clone() for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in outs}
            if name == "given" or job.device is Device.CPU:  # on the CPU every checked call is watched
                with watch_host_compute(args, list(roles.outputs)) as watch:
                    fn(*args)
                    self.sync()
                if watch.reason:
                    self.chan.send(CaseFailed(case=case.label, status=Status.REJECTED, reason=watch.reason))
                    return None
            else:
                fn(*args)
                self.sync()
            changed = [i for i, a in pristine.items() if not same_bits(a, args[i])]
            if changed:
                why = roles.tampered(changed)
                self.chan.send(CaseFailed(case=case.label, status=Status.REJECTED, reason=why))
                return None
            samples.append(self._save(case.label, name, {i: args[i].detach().clone() for i in outs}, base_seed, None,
                                      {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in outs}))
            if before is not None and fails_check(rt.config, sizes, before, args, list(outs)):
                self.wrong = True  # its fresh runs still saved: the judge asks for every checked run
        return samples

    def _timed(self, case: CaseSpec, fn, backend) -> tuple[list[Sample], dict]:
        rt, job = self.rt, self.job
        sets = [rt.make_args(case, set_seed(job, k))[0] for k in range(job.timing.input_sets)]
        work = AfterWork(sets, rt.outputs(sets[0]), rt.roles(sets[0]).inouts)
        n_keep = min(SAMPLED_CALLS, max(1, SAMPLED_BYTES // max(out_bytes(sets, work.outs), 1)))

        def saved(check: list) -> list[Sample]:
            if work.refereed or job.retime:  # the referee's kept calls (below), not the timer's; a re-time: none
                return []
            out = []
            for call, k, seed in check:
                found = work.take(call, k)
                if found is not None:
                    out.append(self._save(case.label, timed_name(call), found, set_seed(job, k), seed))
            work.clear()
            return out

        work.poison_all()
        samples: list[Sample] = []
        work.begin_loop()
        with referee_client.timed_loop(case.label, False, len(sets), n_keep):
            timing = self.timer.eager(case.label, LoopKind.EAGER, fn, sets, work, n_keep,
                                      on_loop=lambda check: samples.extend(saved(check)))
        samples += saved(timing.pop("check"))  # the Python timer's, told at the end
        for call, (k, seed) in sorted(work.kept.items() if not job.retime else ()):  # the referee's, after each digest
            found = work.take(call, k)
            if found is not None:
                samples.append(self._save(case.label, timed_name(call), found, set_seed(job, k), seed))
        if not job.timing.graphs:  # a display figure, never scored: a capture and a loop a case (settings.py)
            gpu, note = None, "not timed (OPTAGENT_GRAPH_TIMING=1 times graph replays too)"
        else:  # the timer's own kept calls, the referee not asked: a display figure, never scored
            refereed, work.refereed = work.refereed, False
            gpu, note = self.timer.gpu(case.label, fn, sets, getattr(backend, "graph_capturable", True), work, n_keep,
                                       work.poison_all)
            samples += saved(gpu.pop("check")) if gpu else []
            work.refereed = refereed
        return samples, {"timing": Timing(**timing), "gpu": Timing(**gpu) if gpu else None, "gpu_note": note}
