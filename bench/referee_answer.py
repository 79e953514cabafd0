"""How long the harness waits for the referee's answer to a timed call's digest (issue 31): R's round trip.

    python bench/referee_answer.py [--calls N] [--busy-parent]

The parent's referee (evaluation/referee.py, behind its native clock where one builds) answers a worker process that
asks as the harness does: per timed call T and D (the clock answers those itself), then ``R <call> 0 <digest>``,
with 0.2 ms between calls; the worker times each R from its question to its answer. ``--busy-parent``: a Python
thread spins in the parent throughout, as a planner's or another lane's work would, holding the interpreter's lock
but for its switch interval. Prints the median and 90th percentile in microseconds, and who answered (the clock or
the referee's thread). Any machine: no GPU is used.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from optagent.evaluation import referee
from optagent.worker import referee_client


def worker(answers: int, questions: int, calls: int) -> None:
    referee_client._FDS = (answers, questions)  # the harness's own client, on the pipes' child ends (as call_cost.py)
    ask = referee_client.ask
    ask("B bench-1 eager 1 3")
    waits = []
    for call in range(calls):
        ask("T")
        ask("D")
        t0 = time.perf_counter()
        ask(f"R {call} 0 " + "ab" * 32)
        waits.append((time.perf_counter() - t0) * 1e6)
        time.sleep(0.0002)
    ask("E")
    waits.sort()
    print(f"R round trip: median {waits[len(waits) // 2]:.1f} us, p90 {waits[int(len(waits) * 0.9)]:.1f} us "
          f"over {calls} calls", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--busy-parent", action="store_true")
    a = p.parse_args()
    ref = referee.Referee()
    answers, questions = (os.dup(fd) for fd in ref.child_fds)
    ref.started()
    print(f"answered by {'the native clock' if ref._relay is not None else 'the referee thread'}"
          f"{', a Python thread spinning in the parent' if a.busy_parent else ''}", flush=True)
    pid = os.fork()  # the worker: a process of its own, as the harness is
    if pid == 0:
        try:
            worker(answers, questions, a.calls)
        finally:
            os._exit(0)
    os.close(answers)
    os.close(questions)
    stop = threading.Event()
    if a.busy_parent:
        threading.Thread(target=lambda: [sum(range(1000)) for _ in iter(stop.is_set, True)], daemon=True).start()
    os.waitpid(pid, 0)
    stop.set()
    ref.finish()
    if ref.violation:
        raise SystemExit(f"referee: {ref.violation}")


if __name__ == "__main__":
    main()
