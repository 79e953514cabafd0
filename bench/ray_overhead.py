"""Ray's overhead per candidate against the local pool, on one GPU: the same candidates through both pools.

    python bench/ray_overhead.py [--task DIR] [--language L] [--candidates N] [--order local,ray] [--out FILE]

Each pool (the local one, then the Ray one on a local Ray instance, or --address's cluster) evaluates
the same N candidates as one round (the package's starter, each copy marked by a comment, so that no
two are the same text), then re-times two of them back to back as the acceptance rule does. Per pool
it prints: its start (local: nothing to start; Ray: ray.init and the lane actors ready, each with its
health check), seconds per candidate over the round (its wall / N), the mean evaluation wall_s the
results report (the same work inside the actor), and the re-time's wall. The overhead is Ray's
seconds per candidate minus the local pool's: what the actors, the streamed records and the object
store cost a candidate. One lane each: the local pool's first visible GPU, Ray's one actor (num_gpus=1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from optagent.app.build import build_evaluator, build_pool
from optagent.evaluation.gpus import gpu_visible
from optagent.protocols import PoolJob
from optagent.schema import ClusterEngine, Device, Language, RunConfig
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]


def candidates(source: str, language: Language, n: int) -> list[PoolJob]:
    mark = "//" if language is Language.CUDA else "#"
    return [PoolJob(i, f"{source.rstrip()}\n{mark} candidate {i}\n", language) for i in range(1, n + 1)]


def measure(kind: ClusterEngine, evaluator, jobs: list[PoolJob], address: str | None) -> dict:
    t0 = time.monotonic()
    config = RunConfig.model_construct(cluster=kind, cluster_address=address)  # the builder reads these two
    pool = build_pool(evaluator, None, config)
    started, lanes = time.monotonic() - t0, pool.lanes
    try:
        t1 = time.monotonic()
        results = [r for _, r in pool.evaluate(jobs)]
        round_s = time.monotonic() - t1
        t2 = time.monotonic()
        again = pool.retime(jobs[:2])
        retime_s = time.monotonic() - t2
    finally:
        pool.close()
    return {"pool": kind.value, "start_s": started, "round_s": round_s, "per_candidate_s": round_s / len(jobs),
            "mean_eval_s": statistics.mean(r.wall_s for r in results), "retime_s": retime_s,
            "passed": sum(r.status.ok for r in results), "retime_passed": sum(r.status.ok for r in again),
            "candidates": len(jobs), "lanes": lanes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default=str(ROOT / "tasks" / "flashattn_task_package"))
    p.add_argument("--language", default=Language.TRITON.value, choices=[x.value for x in Language])
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--order", default="local,ray", help="pools in this order, comma-separated (repeat to alternate)")
    p.add_argument("--address", help="a running Ray cluster's address (default: a local Ray instance)")
    p.add_argument("--out", help="write the figures as JSON here")
    a = p.parse_args()
    task = load_task(a.task)
    device = Device.CUDA if gpu_visible() else Device.CPU
    language = Language(a.language)
    evaluator = build_evaluator(task, device, None)
    jobs = candidates(task.starter(language).source, language, a.candidates)
    rows = []
    for name in a.order.split(","):
        row = measure(ClusterEngine(name.strip()), evaluator, jobs, a.address)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"{task.name}, {language.value} starter x {a.candidates} on {device.value}")
    print(f"{'pool':<6} {'start s':>8} {'round s':>8} {'s/cand':>8} {'eval s':>8} {'retime s':>9} {'passed':>7}")
    for r in rows:
        print(f"{r['pool']:<6} {r['start_s']:>8.1f} {r['round_s']:>8.1f} {r['per_candidate_s']:>8.2f} "
              f"{r['mean_eval_s']:>8.2f} {r['retime_s']:>9.1f} {r['passed']:>4}/{r['candidates']}")
    by = {r["pool"]: r for r in rows}  # the last of each kind
    if "local" in by and "ray" in by:
        d = by["ray"]["per_candidate_s"] - by["local"]["per_candidate_s"]
        share = d / by["local"]["per_candidate_s"]
        print(f"Ray's overhead per candidate: {d:+.2f} s ({share:+.1%} of the local pool's)")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
