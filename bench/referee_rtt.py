"""What a referee's clock would see of a GPU call (issue 31): one request's round trip against the call itself.

    python bench/referee_rtt.py [--device cuda|cpu] [--requests N] [--elements 4194304,33554432]

A referee outside the candidate's process can only time a call as the interval from its request to the
launcher's "done" (evaluation/referee.py times CPU calls so). Before building one for the GPU, this measures
what that interval holds there: a child process (the launcher) waits on a pipe, runs `y = x + 1` on N elements
(or nothing: an empty request) and synchronises, then answers; the parent times each request by its own clock.
Empty and kernel requests are interleaved at random, so drift hits both alike. The child also times the same
call with CUDA events, as the harness's timer does. Printed per size: the median and 10-90% spread of the
round trip for empty and kernel requests, their difference (the referee's estimate of the call), and the
events' median: how far a referee's estimate is from the call, and how much noise it carries.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

CHILD = r'''
import os, sys, statistics, torch
r, w, n, dev = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = torch.randn(n, device=dev)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(20):
    y = x + 1
sync()
os.write(w, b"r")
while True:
    q = os.read(r, 1)
    if not q or q == b"q":
        break
    if q == b"k":
        y = x + 1
    sync()
    os.write(w, b"d")
times = []
if dev == "cuda":
    for _ in range(200):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); y = x + 1; b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
print(statistics.median(times) if times else float("nan"), flush=True)
'''


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"{statistics.median(xs):8.1f} ({q[0]:.1f}-{q[-1]:.1f})"


def one_size(n: int, device: str, requests: int) -> None:
    q_r, q_w = os.pipe()
    a_r, a_w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(q_r), str(a_w), str(n), device],
                             pass_fds=(q_r, a_w), stdout=subprocess.PIPE, text=True)
    os.close(q_r)
    os.close(a_w)
    assert os.read(a_r, 1) == b"r"
    kinds = [b"e", b"k"] * (requests // 2)
    random.shuffle(kinds)
    rtt: dict[bytes, list[float]] = {b"e": [], b"k": []}
    for kind in kinds:
        t0 = time.perf_counter()
        os.write(q_w, kind)
        os.read(a_r, 1)
        rtt[kind].append((time.perf_counter() - t0) * 1e6)
    os.write(q_w, b"q")
    events_us = float(child.communicate(timeout=120)[0].strip() or "nan")
    os.close(q_w)
    os.close(a_r)
    estimate = statistics.median(rtt[b"k"]) - statistics.median(rtt[b"e"])
    print(f"{n:>10} {spread(rtt[b'e']):>24} {spread(rtt[b'k']):>24} {estimate:10.1f} {events_us:10.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--elements", default="65536,4194304,33554432")
    a = p.parse_args()
    print(f"{'elements':>10} {'empty request us (10-90%)':>24} {'kernel request us':>24} {'k - e us':>10} "
          f"{'events us':>10}", flush=True)
    for n in (int(x) for x in a.elements.split(",") if x):
        one_size(n, a.device, a.requests)


if __name__ == "__main__":
    main()
