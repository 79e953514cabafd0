"""Where one evaluation's seconds go, finer than its cost split (issue 31).

    python bench/eval_profile.py [PACKAGE_DIR] [KERNEL] [--device cuda|cpu] [--top N]

Evaluates KERNEL (default: the package's Triton starter) twice with the evaluator a run builds: once to
warm the caches a run has warm by its second candidate (Triton's, the measured ceilings), then again
with every harness message's arrival time recorded (the candidate process's phases case by case) and
the judge run in this process under cProfile instead of in its sandboxed worker, so that its hot spots
show. A bench, never a run's path: the judge here is outside its sandbox (it loads no candidate code;
the saved outputs are read as worker/sample_file.py reads them there).

--retime profiles a re-time of the kernel instead of its second evaluation (evaluate_on(judge=False):
timing only, no judge). --candidate profiles the candidate process's work instead: the harness (worker/candidate.py) runs the
kernel in this process under cProfile, with the Python timer and no guard, so only for kernels that are
trusted (the package's starters); its verdict means nothing, its hot spots are the point.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

from optagent.app.build import build_evaluator
from optagent.evaluation import evaluator as evaluator_mod
from optagent.evaluation.safe_files import open_samples
from optagent.evaluation.sandbox import WorkerRun
from optagent.evaluation.scratch import scratch_fd
from optagent.messages import Channel, Job, parse_messages
from optagent.progress import Progress
from optagent.schema import Device, Language
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]


def judge_in_process(top: int, keep: dict):
    def _judge(self, job: Job, relay=None, control=None, early=None) -> WorkerRun:
        from optagent.worker.judge import judge

        job, fds = open_samples(job, scratch_fd(Path(job.scratch)))
        with tempfile.TemporaryFile() as out:
            prof = cProfile.Profile()
            t0 = time.monotonic()
            try:
                prof.runcall(judge, job, Channel(out.fileno(), job.nonce))
            finally:
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the judge closed it
            wall = time.monotonic() - t0
            out.seek(0)
            messages, _ = parse_messages(out.read(), job.nonce)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
        keep["judge_wall"], keep["judge_profile"] = wall, text.getvalue()
        keep["samples"] = sum(len(v) for v in job.samples.values())
        return WorkerRun(messages=messages)
    return _judge


def candidate_in_process(top: int, keep: dict):
    """run_worker for the candidate's job: the harness in this process under cProfile (see the docstring)."""
    real = evaluator_mod.run_worker

    def _run(job: Job, timeout_s: float, on_message=None, control=None, fds=()) -> WorkerRun:
        if job.mode != "candidate":
            return real(job, timeout_s, on_message=on_message, control=control, fds=fds)
        from optagent.worker.candidate import Candidate

        job = job.model_copy(update={"guard": False})  # the import lock would hold this process too
        with tempfile.TemporaryFile() as out:
            prof = cProfile.Profile()
            t0 = time.monotonic()
            prof.runcall(Candidate(job, Channel(out.fileno(), job.nonce)).run)
            keep["candidate_wall"] = time.monotonic() - t0
            out.seek(0)
            messages, _ = parse_messages(out.read(), job.nonce)
        for m in messages:
            if on_message:
                on_message(m)
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("cumulative").print_stats(top)
        stats.sort_stats("tottime").print_stats(top // 2)
        keep["candidate_profile"] = text.getvalue()
        return WorkerRun(messages=messages)
    return _run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", nargs="?", default=str(ROOT / "tasks" / "flashattn_task_package"))
    p.add_argument("kernel", nargs="?")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--language", default="triton")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--candidate", action="store_true", help="profile the candidate's harness, not the judge")
    p.add_argument("--fresh", action="store_true", help="the profiled evaluation of a source of its own (a comment"
                   " added), as a run's new candidate is: compiled afresh, not lent the first's kernels")
    p.add_argument("--retime", action="store_true", help="profile a re-time of the kernel (timing only, no judge)"
                   " instead of its second evaluation: with --candidate, its harness")
    a = p.parse_args()
    if a.candidate:
        os.environ["OPTAGENT_TIMER"] = "python"  # the harness runs here: no native timer's descriptors
    task = load_task(Path(a.package))
    lang = Language(a.language)
    source = Path(a.kernel).read_text() if a.kernel else task.starter(lang).source
    ev = build_evaluator(task, Device(a.device), None)
    t0 = time.monotonic()
    first = ev.evaluate(source, lang)
    print(f"warm-up evaluation: {first.status.value} in {time.monotonic() - t0:.1f} s; costs {first.costs}", flush=True)

    events: list[tuple[float, Progress]] = []
    keep: dict = {}
    if a.candidate:
        evaluator_mod.run_worker = candidate_in_process(a.top, keep)
    else:
        evaluator_mod.SandboxEvaluator._judge = judge_in_process(a.top, keep)
    t0 = time.monotonic()
    if a.fresh:
        source += "\n// profiled\n" if lang is Language.CUDA else "\n# profiled\n"
    second = ev.evaluate_on(source, lang, progress=lambda e: events.append((time.monotonic(), e)),
                            judge=not a.retime)
    wall = time.monotonic() - t0
    print(f"profiled {'re-time' if a.retime else 'evaluation'}: {second.status.value} in {wall:.1f} s; costs {second.costs}")
    spans: dict[tuple[str, Optional[str]], float] = defaultdict(float)
    for (t, e), (t_next, _) in zip(events, events[1:] + [(t0 + wall, None)]):
        spans[(e.phase.value, e.case)] += t_next - t
    print("\nseconds from each progress event to the next (phase, case):")
    for (phase, case), s in sorted(spans.items(), key=lambda kv: -kv[1])[:30]:
        print(f"  {s:7.2f}  {phase:<14} {case or ''}")
    if a.candidate:
        print(f"\ncandidate's harness in this process: {keep.get('candidate_wall', 0):.2f} s")
        print(keep.get("candidate_profile", "(no candidate ran)"))
        return
    print(f"\njudge in this process: {keep.get('judge_wall', 0):.2f} s for {keep.get('samples')} saved samples")
    print(keep.get("judge_profile", "(no judge ran)"))


if __name__ == "__main__":
    main()
