"""A real boundary without bubblewrap: Landlock, or no evaluation at all.

Where bwrap is missing (forced here, or taken off PATH), the worker makes everything but its scratch
directory read-only to itself with Landlock before any candidate code exists; where neither works,
the evaluation refuses to start with one line saying what to install, unless `none` is asked for
by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import optagent
from optagent.cli.main import main
from optagent.evaluation import isolation
from optagent.schema import Mechanism
from optagent.worker import landlock

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ROOT / "tests" / "attacks"
STARTER = ROOT / "tasks/flashattn_task_package/starter/decode_triton.py"
LANDLOCK = pytest.mark.skipif(landlock.abi() < 1, reason="this kernel has no Landlock")
PLANTED = "optagent_attack_planted"

RESTRICTED = """
import json, os, socket, sys
from optagent.worker import landlock
scratch, outside, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
version = landlock.restrict([scratch])
def tried(f):
    try:
        f()
        return True
    except Exception:  # OSError, or the child's failure
        return False
print(json.dumps({"abi": version,
    "scratch": tried(lambda: open(os.path.join(scratch, "f"), "w").close()),
    "outside": tried(lambda: open(outside, "w").close()),
    "link": tried(lambda: os.symlink("/etc/passwd", outside + ".lnk")),
    "mkdir": tried(lambda: os.mkdir(outside + ".d")),
    "devnull": tried(lambda: open("/dev/null", "w").write("x")),
    "signal": tried(lambda: os.kill(parent, 0)),
    "child": tried(lambda: __import__("subprocess").run(["touch", outside + ".child"], check=True))}))
"""


@LANDLOCK
def test_landlock_leaves_only_the_scratch_directory_writable(tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    out = subprocess.run([sys.executable, "-c", RESTRICTED, str(scratch), str(outside), str(os.getpid())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["scratch"] and seen["devnull"]
    assert not (seen["outside"] or seen["link"] or seen["mkdir"] or seen["child"]), seen
    assert not any(p.name.startswith("outside") for p in tmp_path.iterdir())
    if seen["abi"] >= 6:  # signals to processes outside the domain (the orchestrator) refused
        assert not seen["signal"]


def test_no_sandbox_refuses_to_evaluate_with_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "_bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(isolation, "_landlock_problem", lambda: "Landlock is not available in this kernel")
    monkeypatch.delenv(isolation.ENV, raising=False)
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), str(STARTER), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "no sandbox for candidate kernels here" in err and "apt-get install bubblewrap" in err
    assert "--isolation none" in err
    monkeypatch.setenv(isolation.ENV, "auto")
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), str(ATTACKS / "read_env.py"), "--device", "cpu",
                 "--isolation", "none"]) == 1  # named: it runs (the scan rejects this one)
    assert "isolation: none" in capsys.readouterr().out
    monkeypatch.setenv(isolation.ENV, "landlock")
    with pytest.raises(Exception, match="landlock: Landlock is not available"):
        isolation.mechanism()
    monkeypatch.setenv(isolation.ENV, "none")  # by name, it runs
    assert isolation.mechanism() is Mechanism.NONE


@LANDLOCK
def test_auto_takes_landlock_where_bwrap_is_missing(monkeypatch):
    monkeypatch.setattr(isolation, "_bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.delenv(isolation.ENV, raising=False)
    assert isolation.mechanism() is Mechanism.LANDLOCK
    assert isolation.describe(Mechanism.LANDLOCK).ro_fs


SCRIPT = """
import sys
from pathlib import Path
import optagent.evaluation.evaluator as E
from optagent.schema import Language
from optagent.task import load_task
task = load_task({task!r})
cases = [c for c in E.select_cases(task, "cpu", 0, None, hidden=False) if c.label == "smoke-1"]
src = Path({kernel!r}).read_text().replace({mark!r}, Path({inc!r}).read_text().rstrip("\\n"))
ev = E.SandboxEvaluator(task, "cpu", cases, timeout_s=180, static_scan=False, guard=False)
print(ev.evaluate(src, Language.TRITON).model_dump_json())
"""
MARK = ("# attack fixture: the decode starter's kernel and _launch(heads, scale) stand here "
        "(tests/attacks/decode_kernel.inc)")


@LANDLOCK
@pytest.mark.parametrize("how", ["no bwrap on PATH", "forced"])
def test_without_bwrap_a_candidate_cannot_write_outside_its_scratch(tmp_path, how):
    """The write_outside fixture, guard and scan off, in an orchestrator that finds no bwrap."""
    scratch, cache = tmp_path / "scratch", tmp_path / "cache"
    env = {**os.environ, "OPTAGENT_SCRATCH": str(scratch), "OPTAGENT_CACHE": str(cache)}
    if how == "forced":
        env[isolation.ENV] = "landlock"
    else:  # nothing on PATH: neither bwrap nor unshare is found, Landlock alone stands
        env.pop(isolation.ENV, None)
        env["PATH"] = str(tmp_path / "empty")
    script = SCRIPT.format(task=str(ROOT / "tasks/flashattn_task_package"), kernel=str(ATTACKS / "write_outside.py"),
                           mark=MARK, inc=str(ATTACKS / "decode_kernel.inc"))
    host_tmp = Path("/tmp") / PLANTED
    host_tmp.unlink(missing_ok=True)
    package = Path(optagent.__file__).parent / f"{PLANTED}.py"
    try:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["isolation"]["mechanism"] == "landlock" and result["isolation"]["ro_fs"]
        assert result["status"] == "PASSED", result["reason"]
        left = [p for p in (host_tmp, package, scratch / PLANTED, scratch / f"{PLANTED}_via_link", cache / PLANTED)
                if p.exists()]
        assert not left, f"written outside the scratch directory: {left}"
    finally:
        host_tmp.unlink(missing_ok=True)
        package.unlink(missing_ok=True)
