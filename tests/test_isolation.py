"""The sandbox as the operating system keeps it: namespaces, a read-only view, limits, keys.

The isolation tests run a payload under each mechanism this machine allows (bwrap, unshare)
with no Python guard at all, so that what they show is the operating system's doing; a
run without isolation is the control that shows the payload would have won.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from optagent.cli.main import main
from optagent.evaluation import isolation
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation.limits import Limits, Watch
from optagent.evaluation.log_tap import LogTap
from optagent.evaluation.worker_command import child_env
from optagent.schema import EvalResult, Language, Mechanism, Status
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ROOT / "tests" / "attacks"
STARTER = ROOT / "tasks/flashattn_task_package/starter/decode_triton.py"
FAKE_KEY = "sk-optagent-isolation-0123456789FAKE"
DIGEST = hashlib.sha256(FAKE_KEY.encode()).hexdigest()
SLEEPER = "sleep 31.4159"


def works(mech: Mechanism) -> bool:
    if mech is Mechanism.BWRAP:
        return isolation._bwrap_problem() is None
    return isolation._unshare_flags()[0] is not None


MECHANISMS = [pytest.param(m, marks=pytest.mark.skipif(not works(m), reason=f"{m.value} does not work here"))
              for m in (Mechanism.BWRAP, Mechanism.UNSHARE)]


def sleepers() -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and SLEEPER.encode() in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


@pytest.fixture
def no_sleepers():
    yield
    for pid in sleepers():  # only the control run leaves one: ours, by its own marker
        os.kill(pid, 9)


@pytest.fixture(scope="module")
def task():
    return load_task(ROOT / "tasks/flashattn_task_package")


# ---------------------------------------------------------------------------- choosing, recording

def test_a_bad_isolation_value_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("OPTAGENT_ISOLATION", "chroot")
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), str(STARTER), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "OPTAGENT_ISOLATION='chroot': must be one of auto, bwrap, landlock, unshare, none" in err
    monkeypatch.setenv("OPTAGENT_ISOLATION", "auto")
    monkeypatch.setenv("OPTAGENT_MEMORY_LIMIT_GIB", "lots")
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), str(STARTER), "--device", "cpu"]) == 2
    assert "OPTAGENT_MEMORY_LIMIT_GIB='lots'" in capsys.readouterr().err


def test_every_verdict_names_its_isolation(monkeypatch, capsys):
    """Even a kernel rejected before running says what it would have run under; none is shown as such."""
    kernel = str(ATTACKS / "read_env.py")
    monkeypatch.setenv("OPTAGENT_ISOLATION", "none")
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), kernel, "--device", "cpu"]) == 1
    assert "isolation: none" in capsys.readouterr().out
    monkeypatch.delenv("OPTAGENT_ISOLATION")
    assert main(["eval", str(ROOT / "tasks/flashattn_task_package"), kernel, "--device", "cpu", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    expected = isolation.mechanism()
    assert doc["isolation"]["mechanism"] == expected.value
    assert doc["isolation"]["memory_gib"] and doc["isolation"]["output_mib"] == 64
    if expected is Mechanism.BWRAP:
        assert doc["isolation"]["ro_fs"] and doc["isolation"]["pid_ns"] and doc["isolation"]["no_network"]
    # a record from before isolation existed reads back as none
    old = {k: v for k, v in doc.items() if k not in ("isolation", "geomean_speedup")}
    assert EvalResult.model_validate(old).isolation.mechanism is Mechanism.NONE


# ---------------------------------------------------------------------------- what a sandboxed process sees

VIEW = """
import json, os, socket, sys
cache, other = sys.argv[1], sys.argv[2]
def writes(path):
    try:
        with open(os.path.join(path, "probe"), "w"):
            pass
        return True
    except OSError:
        return False
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    net = True
except OSError:
    net = False
print(json.dumps({"uid": os.getuid(), "pids": [p for p in os.listdir("/proc") if p.isdigit()],
                  "cache": writes(cache), "scratch": writes("."), "tmp": writes("/tmp"),
                  "tmp_listing": os.listdir("/tmp"), "other_scratch": os.path.exists(other), "net": net}))
"""


@pytest.mark.skipif(not works(Mechanism.BWRAP), reason="bwrap does not work here")
def test_bwrap_view_of_the_machine(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("OPTAGENT_CACHE", str(cache))
    base = tmp_path / "scratch-base"
    mine, other = base / "eval-mine", base / "eval-other"
    mine.mkdir(parents=True)
    other.mkdir()
    (mine / "view.py").write_text(VIEW)
    sentinel = Path(f"/tmp/optagent-view-sentinel-{os.getpid()}")  # another program's file in the real /tmp
    sentinel.touch()
    env = isolation.worker_env(child_env("cpu", "m"), Mechanism.BWRAP, mine)
    seen = {}
    for kind, writable in (("candidate", []), ("judge", [cache])):
        argv = isolation.wrap([sys.executable, str(mine / "view.py"), str(cache), str(other)], env, Mechanism.BWRAP,
                              mine, "cpu", str(ROOT / "tasks/flashattn_task_package"), writable, [])
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        seen[kind] = json.loads(out.stdout)
    sentinel.unlink()
    cand = seen["candidate"]
    assert cand["uid"] == 65534 and len(cand["pids"]) <= 3  # bwrap's init and this process
    assert cand["scratch"] and cand["tmp"] and sentinel.name not in cand["tmp_listing"] and not cand["net"]
    assert not cand["cache"], "a candidate wrote the cache of measured ceilings"
    assert not cand["other_scratch"], "another evaluation's scratch directory was visible"
    assert seen["judge"]["cache"], "the judge could not write the cache"


# ---------------------------------------------------------------------------- keys and escapees

def orchestrate(mech: Mechanism, scratch: Path) -> str:
    """Runs the scan_environ fixture's payload, with no guard, under `mech`, from an orchestrator
    whose own environment block holds a key; returns what the payload reported."""
    runner = scratch / "runner.py"
    runner.write_text(f"import runpy; print(runpy.run_path({str(ATTACKS / 'scan_environ.py')!r})['scan']())\n")
    script = textwrap.dedent(f"""
        import subprocess, sys
        from pathlib import Path
        from optagent.evaluation import isolation
        from optagent.evaluation.worker_command import child_env
        from optagent.schema import Mechanism
        mech, scratch = Mechanism({mech.value!r}), Path({str(scratch)!r})
        env = isolation.worker_env(child_env("cpu", "marker"), mech, scratch)
        argv = isolation.wrap([sys.executable, {str(runner)!r}], env, mech, scratch, "cpu", {str(ROOT)!r}, [], [])
        with open(scratch / "report", "w") as f:  # a file: a pipe would wait for the sleeper that holds it
            subprocess.run(argv, env=env, cwd=scratch, stdout=f, stderr=subprocess.STDOUT, timeout=300)
        print((scratch / "report").read_text())
    """)
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("mech", MECHANISMS)
def test_no_key_and_no_survivor_under_isolation(tmp_path, mech, no_sleepers):
    report = orchestrate(mech, tmp_path)
    assert "secrets found" in report, report
    assert DIGEST not in report
    time.sleep(0.5)
    assert sleepers() == [], f"a process the payload started outlived it under {mech.value}"


def test_without_isolation_the_payload_wins(tmp_path, no_sleepers):
    """The control: with none, the orchestrator's key is read and the sleeper survives."""
    report = orchestrate(Mechanism.NONE, tmp_path)
    assert DIGEST in report
    assert sleepers()


def test_the_command_line_moves_keys_out_of_its_environment_block(tmp_path):
    script = textwrap.dedent("""
        import ctypes, json, os
        from optagent.secret_env import hide_secrets
        from optagent.llm.config import llm_settings_from_env
        hide_secrets()
        block = open("/proc/self/environ", "rb").read()
        print(json.dumps({"in_block": b"sk-optagent" in block, "in_environ": "OPENAI_API_KEY" in os.environ,
                          "llm_key": llm_settings_from_env().api_key, "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
                          "pid": os.getpid()}))
    """)
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "OPTAGENT_BASE_URL": "http://x", "OPTAGENT_MODEL": "m"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    doc = json.loads(out.stdout)
    assert doc == {"in_block": False, "in_environ": False, "llm_key": FAKE_KEY, "dumpable": 0, "pid": doc["pid"]}


def test_a_running_eval_holds_no_key_in_its_environment_block(tmp_path):
    """The real CLI, read from outside while it evaluates (a hanging kernel)."""
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "OPTAGENT_SCRATCH": str(tmp_path)}
    exe = Path(sys.executable).with_name("optagent")
    proc = subprocess.Popen([str(exe), "eval", str(ROOT / "tasks/flashattn_task_package"), str(ATTACKS / "hang.py"),
                             "--device", "cpu", "--timeout", "30", "--quiet"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        block = b""
        for _ in range(200):
            block = Path(f"/proc/{proc.pid}/environ").read_bytes()
            if b"OPTAGENT_SECRETS_FD" in block:  # re-executed
                break
            time.sleep(0.05)
        assert b"OPTAGENT_SECRETS_FD" in block and FAKE_KEY.encode() not in block
    finally:
        proc.kill()
        proc.wait()


def test_scan_environ_through_the_evaluator_finds_nothing_and_leaves_nothing(tmp_path, no_sleepers):
    """The fixture as a candidate, scan bypassed, from an orchestrator whose environment holds a key."""
    script = textwrap.dedent(f"""
        import optagent.evaluation.evaluator as E
        from optagent.task import load_task
        from optagent.schema import Language
        task = load_task({str(ROOT / 'tasks/flashattn_task_package')!r})
        cases = E.select_cases(task, "cpu", 0, None, hidden=False)[:1]
        src = open({str(ATTACKS / 'scan_environ.py')!r}).read()
        print(E.SandboxEvaluator(task, "cpu", cases, timeout_s=120, static_scan=False).evaluate(src, Language.TRITON).model_dump_json())
    """)
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "OPTAGENT_SCRATCH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = EvalResult.model_validate_json(out.stdout.strip().splitlines()[-1])
    assert result.status is not Status.PASSED
    assert FAKE_KEY not in out.stdout and DIGEST not in out.stdout
    time.sleep(0.5)
    if result.isolation.pid_ns:
        assert sleepers() == []


# ---------------------------------------------------------------------------- limits

def evaluate(task, source: str, labels=("smoke-1",), timeout: float = 180) -> EvalResult:
    cases = {c.label: c for c in select_cases(task, "cpu", 0, None, hidden=True)}
    return SandboxEvaluator(task, "cpu", [cases[x] for x in labels], timeout_s=timeout,
                            static_scan=False).evaluate(source, Language.TRITON)


GROW = """

_run_kernel = run_kernel


def run_kernel(*args):
    _run_kernel(*args)
    return [torch.ones(512 << 20, dtype=torch.uint8) for _ in range(8)]  # 4 GiB, touched
"""


def test_memory_over_the_limit_is_a_runtime_error_naming_it(task, monkeypatch):
    monkeypatch.setenv("OPTAGENT_MEMORY_LIMIT_GIB", "2")
    result = evaluate(task, STARTER.read_text() + GROW)
    assert result.status is Status.RUNTIME_ERROR, result.reason
    assert re.search(r"exceeded the 2 GiB memory limit", result.reason), result.reason
    assert result.isolation.memory_gib == 2


HOARD = "\n\n_HOARD = torch.ones(600 << 20, dtype=torch.uint8)  # held by the module, case after case\n"


def test_case_modules_are_released_between_cases(task, monkeypatch):
    """600 MB held per case module over four cases stays under a 2 GiB limit: each case's module goes."""
    monkeypatch.setenv("OPTAGENT_MEMORY_LIMIT_GIB", "2")
    result = evaluate(task, STARTER.read_text() + HOARD, labels=("smoke-1", "hidden-1", "hidden-2", "hidden-3"))
    assert result.status is Status.PASSED, result.reason


def test_output_flood_is_cut_and_the_orchestrator_stays_small(tmp_path):
    script = textwrap.dedent(f"""
        import resource
        import optagent.evaluation.evaluator as E
        from optagent.task import load_task
        from optagent.schema import Language
        task = load_task({str(ROOT / 'tasks/flashattn_task_package')!r})
        cases = E.select_cases(task, "cpu", 0, None, hidden=False)[:1]
        src = open({str(ATTACKS / 'print_flood.py')!r}).read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = E.SandboxEvaluator(task, "cpu", cases, timeout_s=300, keep_scratch=True).evaluate(src, Language.TRITON)
        print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        print(r.model_dump_json())
    """)
    env = {**os.environ, "OPTAGENT_SCRATCH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    rss_line, doc = out.stdout.strip().splitlines()[-2:]
    before_kb, after_kb = map(int, rss_line.split())
    result = EvalResult.model_validate_json(doc)
    assert result.status is Status.RUNTIME_ERROR and "wrote over 64 MiB of output" in result.reason, result.reason
    assert after_kb - before_kb < 64 << 10, f"the orchestrator grew by {(after_kb - before_kb) >> 10} MiB"
    log = next(tmp_path.glob("eval-*/candidate.log"))
    assert (64 << 20) <= log.stat().st_size < (64 << 20) + 4096


def test_log_tap_keeps_the_cap_on_disk_and_the_tail_in_memory(tmp_path):
    r, w = os.pipe()
    tap = LogTap(r, tmp_path / "log", cap=1 << 20)
    for i in range(40):
        os.write(w, (f"{i:04d}" * 16384).encode())  # 64 KiB each
    os.close(w)
    tail = tap.close()
    assert tap.over.is_set() and tap.total == 40 * 65536
    assert (1 << 20) < (tmp_path / "log").stat().st_size < (1 << 20) + 100
    assert tail.endswith("0039") and len(tail) == 65536


@pytest.mark.parametrize("what", ["memory", "threads"])
def test_watch_stops_a_tree_over_its_limit(what):
    code = {"memory": "x = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nimport time; time.sleep(30)",
            "threads": "import threading, time\n[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() "
                       "for _ in range(40)]\ntime.sleep(30)"}[what]
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        watch = Watch(proc.pid, Limits(memory_bytes=200 << 20, tasks=20),
                      SimpleNamespace(over=SimpleNamespace(is_set=lambda: False)), "candidate")
        why = None
        for _ in range(200):
            why = watch.check()
            if why:
                break
            time.sleep(0.05)
        pattern = r"exceeded the 0\.2 GiB memory limit" if what == "memory" else r"limit of 20 processes and threads"
        assert why and re.search(pattern, why), why
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(shutil.which("nvcc") is None or not works(Mechanism.BWRAP), reason="needs nvcc and bwrap")
def test_a_sandboxed_cuda_build_does_not_fill_the_shared_build_cache(task, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path / "cache"))
    cases = select_cases(task, "cpu", 0, None, hidden=False)[:1]
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=300).evaluate(task.starter(Language.CUDA).source,
                                                                          Language.CUDA)
    assert result.status is Status.UNSUPPORTED and "compiled" in result.reason, result.reason
    cache = tmp_path / "cache"  # the native timer is the parent's own build (evaluation/native_build.py)
    assert [p for p in cache.rglob("*.so") if p.relative_to(cache).parts[0] != "native"] == []
