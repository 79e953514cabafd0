"""bench/referee_answer.py on the CPU: a worker process asks the referee as the harness does, to the loop's end, with a
Python thread spinning in the parent, and the bench says who answered and how long the answers took."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from optagent.evaluation import native_build

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_asks_a_whole_loop_and_reports_its_answers():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "referee_answer.py"), "--calls", "50", "--busy-parent"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    who = "the native clock" if native_build.referee_clock() is not None else "the referee thread"
    assert f"answered by {who}, a Python thread spinning in the parent" in run.stdout, run.stdout
    assert re.search(r"R round trip: median [\d.]+ us, p90 [\d.]+ us over 50 calls", run.stdout), run.stdout
