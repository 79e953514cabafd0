"""Scratch directories of killed evaluations are removed on the next start; a live process's never are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from optagent.evaluation.scratch import OWNER, keep_scratch, new_scratch, sweep_scratch


def scratch_holder(base: Path) -> tuple[subprocess.Popen, Path]:
    code = ("import sys, time; from pathlib import Path; from optagent.evaluation.scratch import new_scratch; "
            "p, _ = new_scratch(Path(sys.argv[1])); (p / 'candidate.py').write_text('x'); "
            "print(p, flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(base)], stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_scratch_of_a_killed_evaluation_is_swept_and_a_live_ones_is_not(tmp_path):
    base = tmp_path / "scratch"
    killed, killed_dir = scratch_holder(base)
    live, live_dir = scratch_holder(base)
    kept, _ = new_scratch(base)
    keep_scratch(kept)  # --keep-scratch: left for the user
    old_half = base / ".new-eval-20200101-000000-deadbeef"
    old_half.mkdir()
    os.utime(old_half, (time.time() - 3600, time.time() - 3600))
    fresh_half = base / ".new-eval-20200101-000000-cafecafe"
    fresh_half.mkdir()  # another process is making it right now
    try:
        assert (killed_dir / OWNER).is_file() and (killed_dir / "candidate.py").is_file()
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        removed = sweep_scratch(base)
        assert sorted(removed) == sorted([killed_dir, old_half])
        assert not killed_dir.exists() and not old_half.exists()
        assert (live_dir / "candidate.py").is_file() and kept.is_dir() and fresh_half.is_dir()

        live.send_signal(signal.SIGKILL)
        live.wait()
        # the next start sweeps on its own: its first scratch directory
        code = ("import sys; from pathlib import Path; from optagent.evaluation.scratch import new_scratch, remove_scratch; "
                "p, _ = new_scratch(Path(sys.argv[1])); remove_scratch(p)")
        subprocess.run([sys.executable, "-c", code, str(base)], check=True, timeout=60)
        assert not live_dir.exists() and kept.is_dir()
        assert sorted(p.name for p in base.iterdir()) == sorted([kept.name, fresh_half.name])
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
