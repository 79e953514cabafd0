"""Child side of an evaluation: ``python -m optagent.worker JOB_FILE RESULT_FD``.

Three modes. ``candidate`` (untrusted: the kernel is loaded here) times the
baseline before any candidate code exists in the process, then per case loads
a fresh copy of the kernel, runs it on the package's inputs and on freshly
drawn ones, times it, and saves its outputs. ``judge`` (trusted: never loads the
candidate) rebuilds the same inputs from the seeds, computes the references and
gives the verdicts. ``probe`` loads a package for ``optagent task validate``.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import traceback
from contextlib import redirect_stdout
from pathlib import Path

from .jobs import Channel, Job


def _candidate(job: Job, chan: Channel) -> None:
    import torch

    from . import bench
    from .backends import CompileError, Unsupported, backend_for
    from .checks import lock_imports
    from .harness import TaskRuntime, float_scales, poison, refresh_floats
    from .schema import CaseKind

    rt = TaskRuntime(job.task_dir, job.device)
    dev_name = torch.cuda.get_device_name(0) if job.device == "cuda" else "cpu"
    facts = bench.gpu_facts() if job.device == "cuda" else None
    chan.send("hello", baseline_label=rt.baseline_label, device_name=dev_name, gpu=facts)
    t = job.timing
    timer = bench.Timer(job.device, t.min_iters, t.max_iters, t.budget_s, t.warmup)
    sync = torch.cuda.synchronize if job.device == "cuda" else (lambda: None)
    timed_cases = [c for c in job.cases if c.kind is not CaseKind.HIDDEN]

    def baseline(*args):
        with redirect_stdout(io.StringIO()):
            rt.config.baseline(*args)

    # Phase 1: the baseline, timed before any candidate code is in the process.
    for case in timed_cases:
        sets = [rt.make_args(case, job.seed + 7919 * k)[0] for k in range(t.input_sets)]
        chan.send("baseline", case=case.label, timing=timer.eager(baseline, sets), sizes=rt.describe(sets[0]))
        del sets
    sync()

    backend = backend_for(job.language, job.device, job.compiler, job.compile_timeout_s)
    lock_imports()
    try:
        backend.prepare(Path(job.source_path), Path(job.scratch))
    except CompileError as e:
        chan.send("compile", status="COMPILE_ERROR", reason=str(e))
        return
    except Unsupported as e:
        chan.send("compile", status="UNSUPPORTED", reason=str(e))
        return
    chan.send("compile", status="OK")
    out_dir = Path(job.outputs_dir)
    threads_before = {th.ident for th in threading.enumerate()}

    def save(label: str, name: str, args: list, outs: list[int], base_seed, refresh_seed) -> dict:
        path = out_dir / f"{label}-{name}.pt"
        torch.save({i: args[i].detach().cpu().clone() for i in outs}, path)
        return {"name": name, "base_seed": base_seed, "refresh_seed": refresh_seed, "file": str(path)}

    for n, case in enumerate(job.cases):
        chan.send("case_start", case=case.label)
        t0 = bench._perf_counter()
        try:
            fn = backend.load_fresh(f"{n}_{case.label}")
        except (CompileError, Unsupported) as e:
            status = "UNSUPPORTED" if isinstance(e, Unsupported) else "COMPILE_ERROR"
            chan.send("case", case=case.label, status=status, reason=str(e))
            return
        load_ms = (bench._perf_counter() - t0) * 1e3
        samples = []
        # The package's own inputs (seed None), then freshly drawn ones.
        for name, base_seed in (("given", None), ("fresh", job.seed + 104729 + n)):
            if case.kind is not CaseKind.CONTEST and base_seed is None:
                base_seed = job.seed + n  # manifest cases have no "own" inputs: draw them
            args, _ = rt.make_args(case, base_seed)
            outs = rt.outputs(args)
            for i in outs:
                poison(args[i])
            pristine = {i: a.clone() for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in outs}
            fn(*args)
            sync()
            changed = [i for i, a in pristine.items() if not torch.equal(a.view(torch.uint8), args[i].view(torch.uint8))]
            if changed:
                chan.send("case", case=case.label, status="REJECTED",
                          reason=f"modified its input argument(s) {changed} (inputs must stay read-only)")
                return
            samples.append(save(case.label, name, args, outs, base_seed, None))
            del args, pristine
        if case.kind is CaseKind.HIDDEN:
            chan.send("case", case=case.label, status="RAN", samples=samples, load_ms=load_ms)
            continue

        base_seeds = [job.seed + 7919 * k for k in range(t.input_sets)]
        sets = [rt.make_args(case, s)[0] for s in base_seeds]
        outs = rt.outputs(sets[0])
        scales = [float_scales(a, set(outs)) for a in sets]  # of the base inputs, as the judge computes them
        refresh: dict[int, int | None] = {k: None for k in range(len(sets))}
        last_out: dict[int, dict] = {}

        def after(i: int, args: list) -> None:
            # Outside the timed region: keep this call's output, then poison the
            # outputs and redraw the inputs so no call can reuse a previous answer.
            k = i % len(sets)
            last_out[k] = {j: args[j].detach().cpu().clone() for j in outs}
            last_out[k]["seed"] = refresh[k]
            for j in outs:
                poison(args[j])
            refresh[k] = job.seed * 31 + 1000003 * (i + 1) + k
            refresh_floats(args, refresh[k], scales[k])

        for args in sets:
            for j in outs:
                poison(args[j])
        timing = timer.eager(fn, sets, after=after)
        for k, saved in last_out.items():
            path = out_dir / f"{case.label}-timed{k}.pt"
            seed = saved.pop("seed")
            torch.save(saved, path)
            samples.append({"name": f"timed{k}", "base_seed": base_seeds[k], "refresh_seed": seed, "file": str(path)})
        gpu, gpu_note = timer.gpu(fn, sets, capturable=getattr(backend, "graph_capturable", True))
        del sets
        chan.send("case", case=case.label, status="RAN", samples=samples, timing=timing, gpu=gpu,
                  gpu_note=gpu_note, load_ms=load_ms)

    sync()
    extra = [th.name for th in threading.enumerate() if th.ident not in threads_before]
    patched = bench.patched_timers()
    if extra:
        chan.send("integrity", reason=f"left background threads running ({', '.join(extra)[:120]})")
    if patched:
        chan.send("integrity", reason=f"patched the harness's timers ({', '.join(patched)})")
    chan.send("done")


def main() -> None:
    job = Job.model_validate_json(Path(sys.argv[1]).read_text())
    chan = Channel(int(sys.argv[2]), job.nonce)
    try:
        if job.mode == "candidate":
            _candidate(job, chan)
        elif job.mode == "judge":
            from .judge import judge

            judge(job, chan)
        else:
            from .judge import probe

            probe(job, chan)
    except BaseException as e:  # everything reaches the parent as a status, not a traceback
        tb = traceback.format_exc(limit=-4)
        chan.send("error", error=f"{type(e).__name__}: {e}", traceback=tb)
        raise SystemExit(3)
    finally:
        sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks do not run after "done"


if __name__ == "__main__":
    main()
