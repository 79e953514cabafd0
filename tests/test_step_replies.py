"""Step mode read as the prompt asks: a model's replies (IDEA + SEARCH/REPLACE, fenced whole files,
raw source) handed in as files, each against its own parent, and the lineage recorded as named.

The tiny package (seconds per evaluation on CPU), real sandboxed evaluations, the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_outside import _oa
from tests.tiny_package import FAST, NAIVE, tiny_package


def edit(search: str, replace: str, idea: str) -> str:
    return f"IDEA: {idea}\n\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def step(runs: Path, run_id: str, index: int) -> dict:
    return json.loads((runs / run_id / "steps" / f"{index:04d}" / "step.json").read_text())


def source(runs: Path, run_id: str, index: int) -> str:
    return (runs / run_id / "steps" / f"{index:04d}" / "candidate.py").read_text()


LAUNCH = "    _affine[(triton.cdiv(n, 16),)](x, out, n, BLOCK=16)"


def test_a_model_plays_step_mode_in_the_prompts_own_format(tmp_path):
    pkg, runs = tiny_package(tmp_path / "pkg"), tmp_path / "runs"
    started = _oa(tmp_path, "run", str(pkg), "--device", "cpu", "--planner", "external", "--json")
    assert started.returncode == 0, started.stderr
    assert "proposing" not in started.stderr  # nothing proposes: the outside agent does, later
    run_id = json.loads(started.stdout)["run_id"]
    prompt = json.loads(_oa(tmp_path, "feedback", run_id, "--json").stdout)["next_prompt"]
    # the reply format, with its markers, and how to hand a reply in
    assert "<<<<<<< SEARCH" in prompt and ">>>>>>> REPLACE" in prompt and "IDEA:" in prompt
    assert f"optagent propose {run_id} FILE" in prompt and "FILE@STEP" in prompt
    assert "against the kernel above (step 0's)" in prompt

    wider = tmp_path / "wider.txt"  # SEARCH/REPLACE against the starter (step 0, the default parent)
    wider.write_text(edit(LAUNCH, "    _affine[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)", "1024-wide blocks"))
    whole = tmp_path / "whole.md"  # a reply with prose and the whole file in a fenced block
    whole.write_text("IDEA: one program per 4096 elements\n\nThe launch dominates; fewer programs.\n\n```python\n"
                     + FAST + "```\n")
    checked = _oa(tmp_path, "propose", run_id, str(wider), str(whole), "--check")
    assert checked.returncode == 0, checked.stderr
    assert "wider.txt: read as 1 SEARCH/REPLACE block applied to step 0's kernel; IDEA: 1024-wide blocks" \
        in checked.stdout
    assert "whole.md: read as the whole file in a fenced code block" in checked.stdout
    assert not (runs / run_id / "steps" / "0001").exists()  # --check spends nothing

    round1 = _oa(tmp_path, "propose", run_id, str(wider), str(whole), "--json")
    assert round1.returncode == 0, round1.stderr
    fb = json.loads(round1.stdout)
    assert [(s["index"], s["status"], s["parent"], s["idea"]) for s in fb["steps"]] == [
        (1, "PASSED", 0, "1024-wide blocks"), (2, "PASSED", 0, "one program per 4096 elements")]
    assert fb["read"][0].endswith("wider.txt: read as 1 SEARCH/REPLACE block applied to step 0's kernel; IDEA: "
                                  "1024-wide blocks")
    assert source(runs, run_id, 1) == NAIVE.replace(LAUNCH, "    _affine[(triton.cdiv(n, 1024),)](x, out, n, "
                                                    "BLOCK=1024)")
    assert source(runs, run_id, 2) == FAST
    # on the CPU the kernel to improve is the newest passing one: the feedback names it, propose applies to it
    assert "against the kernel above (step 2's)" in fb["next_prompt"]
    assert "(other passing kernels: step 1; each one's source: `" in fb["next_prompt"]  # a FILE@STEP may build on it
    assert f"{run_id}/steps/NNNN/candidate.py`)" in fb["next_prompt"]

    # a block that does not apply to the parent it names: an error with the nearest lines, nothing recorded
    stale = tmp_path / "stale.txt"
    stale.write_text(edit("BLOCK = 4096  # knob: 1024, 2048, 4096", "BLOCK = 2048  # knob: 1024, 2048, 4096", "x"))
    missed = _oa(tmp_path, "propose", run_id, f"{stale}@1")
    assert missed.returncode == 2 and "stale.txt: does not apply to step 1's kernel" in missed.stderr
    assert "Nearest lines" in missed.stderr and not (runs / run_id / "steps" / "0003").exists()
    both = _oa(tmp_path, "propose", run_id, f"{stale}@1", str(whole), "--check")  # --check reads each file
    assert both.returncode == 1 and "stale.txt: NOT READ" in both.stdout and "whole.md: read as" in both.stdout
    failing = _oa(tmp_path, "propose", run_id, f"{wider}@2")  # step 2 has no such launch line either
    assert failing.returncode == 2 and not (runs / run_id / "steps" / "0003").exists()
    hinted = _oa(tmp_path, "propose", run_id, str(wider))  # the default parent (step 2): its blocks fit step 0's
    assert hinted.returncode == 2 and f"Its blocks apply to step 0's kernel: hand it in as {wider}@0" in hinted.stderr
    refused = _oa(tmp_path, "propose", run_id, f"{stale}@1", str(whole))  # one bad file refuses the round: said so
    assert refused.returncode == 2 and "whole.md: read well, not evaluated either" in refused.stderr
    wordy = tmp_path / "wordy.py"
    wordy.write_text("IDEA: " + "a very long idea " * 10 + "\n" + NAIVE)
    clipped = _oa(tmp_path, "propose", run_id, str(wordy), "--check")
    assert clipped.returncode == 0 and "(cut to 120 characters: say it shorter)" in clipped.stdout
    assert not (runs / run_id / "steps" / "0003").exists()
    notpassing = _oa(tmp_path, "propose", run_id, f"{wider}@7")
    assert notpassing.returncode == 2 and "parent 7 is not a passing step" in notpassing.stderr

    # round 2: per-file parents: one file on step 1 (@1), one on the default (step 2), one raw source
    on1 = tmp_path / "on1.txt"
    on1.write_text(edit("    _affine[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)",
                        "    _affine[(triton.cdiv(n, 2048),)](x, out, n, BLOCK=2048)", "2048-wide blocks"))
    on2 = tmp_path / "on2.txt"
    on2.write_text(edit("BLOCK = 4096  # knob: 1024, 2048, 4096", "BLOCK = 1024  # knob: 1024, 2048, 4096",
                        "smaller block, more programs"))
    raw = tmp_path / "raw.py"
    raw.write_text("IDEA: the naive kernel again, raw\n" + NAIVE)
    round2 = _oa(tmp_path, "propose", run_id, f"{on1}@1", str(on2), str(raw))
    assert round2.returncode == 0, round2.stderr
    assert "on1.txt@1" not in round2.stdout and "on1.txt: read as 1 SEARCH/REPLACE block applied to step 1's" \
        in round2.stdout
    assert "raw.py: read as raw source (parent: step 2's kernel); IDEA: the naive kernel again, raw" in round2.stdout
    assert {i: step(runs, run_id, i)["parent"] for i in range(1, 6)} == {1: 0, 2: 0, 3: 1, 4: 2, 5: 2}
    assert [step(runs, run_id, i)["result"]["status"] for i in range(3, 6)] == ["PASSED"] * 3
    assert "BLOCK=2048" in source(runs, run_id, 3) and "BLOCK = 1024  #" in source(runs, run_id, 4)
    assert source(runs, run_id, 5) == NAIVE  # the IDEA: line above the raw source is the idea, not code
    shown = _oa(tmp_path, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "geomean" not in shown.stdout  # a CPU run's interpreter speedups rank nothing: not shown
    board = _oa(tmp_path, "leaderboard")
    assert board.returncode == 0 and "0, 1, 2, 3, 4, 5" in board.stdout and "optagent retime RUN" in board.stdout
    listed = _oa(tmp_path, "runs")
    assert "correctness only" in listed.stdout
