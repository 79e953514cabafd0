"""bench/call_cost.py --variants on the CPU (Triton's interpreter, one small case): every variant's loop runs under
the parent's referee to its end, so the GPU figures it prints were taken as the harness takes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_variant_runs_its_loops_under_the_referee():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "call_cost.py"),
                          str(ROOT / "tests" / "fixtures" / "packages" / "add_rmsnorm"),
                          "--device", "cpu", "--variants", "--calls", "2", "--cases", "1"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    [summary] = [line for line in run.stdout.splitlines() if line.startswith("geomean")]
    for variant in ("full", "noR", "spinR", "light", "redraw", "digest", "sleep", "pollute"):
        assert f" {variant} " in summary, summary
    assert "referee:" not in run.stdout, run.stdout  # no loop broke the referee's order
