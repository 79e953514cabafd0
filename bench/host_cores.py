"""Where the host's slow stretches are: one core's, or the machine's (issue 31, repeatability).

The timer keeps an eager call only when a ~10 us pure-Python probe just before it ran at the host's usual speed
(worker/host_speed.py). This bench runs that probe on every core at once, each in a process pinned to it, for
SECONDS, half of it busy (a probe every 0.5 ms, spinning between) and half with a 2 ms sleep between probes (a worker that idles between calls),
and reads the kernel's steal time per core (/proc/stat) over the same span. It prints, per core, the share of
probes over 1.3x the fastest (host_speed.SLACK), and per 100 ms bin how many cores were slow at once: slow
stretches that hit a few cores at a time can be dodged by placing the timed process on a fast core; ones that hit
all cores at once can only be waited out. A benchmark, not a test.

    python3 bench/host_cores.py [SECONDS] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from optagent.worker.host_speed import SLACK, probe_us

BIN_S = 0.1


def steal() -> dict[int, int]:
    """Per cpu, the steal ticks so far (the hypervisor ran something else on this vCPU)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        parts = line.split()
        if parts[0].startswith("cpu") and parts[0] != "cpu" and len(parts) > 8:
            out[int(parts[0][3:])] = int(parts[8])
    return out


def child(cpu: int, start: float, seconds: float, conn) -> None:
    os.sched_setaffinity(0, {cpu})
    while time.perf_counter() < start:
        pass
    rows = []
    half = start + seconds / 2
    end = start + seconds
    while (now := time.perf_counter()) < end:
        rows.append((now - start, probe_us()))
        if now > half:
            time.sleep(0.002)
        else:  # busy until the next probe, 0.5 ms on: the core never idles, and the rows stay few
            while time.perf_counter() < now + 0.0005:
                pass
    conn.send(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seconds", nargs="?", type=float, default=20.0)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    before, start = steal(), time.perf_counter() + 1.0
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for cpu in cpus:
        r, w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=child, args=(cpu, start, a.seconds, w))
        proc.start()
        pipes.append(r)
        procs.append(proc)
    rows = {cpu: r.recv() for cpu, r in zip(cpus, pipes)}
    for proc in procs:
        proc.join()
    after = steal()
    fastest = min(pr for rs in rows.values() for _, pr in rs)
    slow_at = SLACK * fastest
    print(f"{len(cpus)} cpus, {a.seconds:.0f} s (first half busy, then a 2 ms sleep between probes); "
          f"fastest probe {fastest:.2f} us, slow above {slow_at:.2f} us")
    print(f"{'cpu':>4} {'probes':>7} {'median':>7} {'p90':>7} {'slow% spin':>11} {'slow% sleep':>12} {'steal ticks':>12}")
    bins: dict[int, set[int]] = {}
    for cpu, rs in rows.items():
        ps = [pr for _, pr in rs]
        spin = [pr for t, pr in rs if t < a.seconds / 2]
        rest = [pr for t, pr in rs if t >= a.seconds / 2]
        q = statistics.quantiles(ps, n=10)
        for t, pr in rs:
            b = int(t / BIN_S)
            bins.setdefault(b, set())
            if pr > slow_at:
                bins[b].add(cpu)
        print(f"{cpu:>4} {len(ps):>7} {statistics.median(ps):>7.2f} {q[-1]:>7.2f} "
              f"{100 * sum(x > slow_at for x in spin) / max(len(spin), 1):>10.1f}% "
              f"{100 * sum(x > slow_at for x in rest) / max(len(rest), 1):>11.1f}% {after.get(cpu, 0) - before.get(cpu, 0):>12}")
    # a bin counts a core slow when any of its probes there was: how many cores at once
    counts = [len(bins[b]) for b in sorted(bins)]
    hist = {n: counts.count(n) for n in sorted(set(counts))}
    print(f"per {BIN_S * 1000:.0f} ms bin, cores with a slow probe: {hist} (of {len(counts)} bins)")
    # the median probe per bin, over all cores: a machine-wide stretch moves it
    per_bin: dict[int, list[float]] = {}
    for rs in rows.values():
        for t, pr in rs:
            per_bin.setdefault(int(t / BIN_S), []).append(pr)
    meds = [statistics.median(v) for _, v in sorted(per_bin.items())]
    print("all-core median probe per second: " + " ".join(
        f"{statistics.median(meds[i:i + 10]):.1f}" for i in range(0, len(meds), 10)))
    if a.json:
        a.json.write_text(json.dumps({"fastest": fastest, "rows": {str(c): r for c, r in rows.items()},
                                      "steal": {str(c): after.get(c, 0) - before.get(c, 0) for c in cpus}}))


if __name__ == "__main__":
    main()
