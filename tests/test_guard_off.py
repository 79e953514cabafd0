"""The in-process guard is a speed bump: with it switched off (and the scan), every attack the sandbox
claims to contain is still contained, by the operating system and the harness's own checks.

Each fixture runs through the real evaluator (SandboxEvaluator(..., static_scan=False, guard=False))
under each isolation this machine has (bwrap, and the Landlock fallback with bwrap forced off), and
the test checks what the guard would have stopped: no file outside the scratch directory, no key in
the verdict, no process left behind, no escape through the kernel's interface, and a verdict that is
not PASSED for a kernel that cheats. Two fixtures are the guard's alone, by design: running a program
(obf_getattr_import: execve stays allowed, the JIT compilers need it, and the program runs inside the
sandbox with its rights) and reading the harness's frames (obf_frame_walk: what it finds there, the
seeds and the timer, gives it nothing the judge and the native timer do not check).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, Optional

import pytest

from attack_fixtures import ATTACKS, attack  # tests/ is on sys.path
from optagent.evaluation import isolation, take_down
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.schema import EvalResult, Status
from optagent.task import load_task
from optagent.worker import landlock

FAKE_KEY = "sk-optagent-guard-off-0123456789FAKE"
GUARD_ONLY = {"obf_getattr_import", "obf_frame_walk"}


def left_in(scratch_root: Path) -> list[int]:
    """Processes still running in one of this test's scratch directories (their working directory)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(scratch_root) in os.readlink(proc / "cwd"):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def not_passed(result: EvalResult, tmp: Path) -> Optional[str]:
    return None if result.status is not Status.PASSED else "a cheating kernel PASSED"


def no_key(result: EvalResult, tmp: Path) -> Optional[str]:
    doc = result.model_dump_json()
    found = FAKE_KEY in doc or hashlib.sha256(FAKE_KEY.encode()).hexdigest() in doc
    return "the key reached the verdict" if found else None


def nothing_outside(result: EvalResult, tmp: Path) -> Optional[str]:
    left = [p for p in (Path("/tmp/optagent_attack_write_file"), tmp / "optagent_attack_outside") if p.exists()]
    return f"written outside the scratch directory: {left}" if left else None


def native_thread_caught(result: EvalResult, tmp: Path) -> Optional[str]:
    caught = result.status is Status.REJECTED and "native thread(s) running" in (result.reason or "")
    return None if caught else f"the spinning thread was not named: {result.status.value}: {result.reason}"


def no_escape(result: EvalResult, tmp: Path) -> Optional[str]:
    return None if result.status is Status.PASSED else f"escaped: {result.reason}"


# fixture: what must hold with the guard off (each check returns what went wrong, or None)
CONTAINED: dict[str, list[Callable[[EvalResult, Path], Optional[str]]]] = {
    # self_kill harms only itself (as PID 1 of unshare's namespace its own SIGKILL is even ignored, and it
    # passes, honestly); fork_bomb's children must not outlive it: both checked by left_in below
    "self_kill": [], "fork_bomb": [], "gc_reader": [not_passed], "write_file": [nothing_outside],
    "calls_standin_runpy": [not_passed], "calls_baseline": [not_passed], "obf_exec_hex": [not_passed],
    "side_thread": [not_passed], "patch_perf_counter": [not_passed], "patch_bench_clock": [not_passed],
    "os_exit": [not_passed], "read_env": [no_key], "read_parent_env": [no_key], "scan_environ": [no_key],
    "torch_decoy": [not_passed], "forge_result": [not_passed], "forge_with_nonce": [not_passed],
    "mutate_input_unchecked": [not_passed], "records_dup2_relay": [not_passed], "ns_escape": [no_escape],
    # a thread with no Python state (pthread_create on machine code), still spinning after the call: x86-64
    "native_thread": [native_thread_caught],
}


def mechanisms() -> list:
    out = [pytest.param("bwrap", marks=pytest.mark.skipif(not shutil.which("bwrap"), reason="no bwrap here"))]
    out.append(pytest.param("landlock", marks=pytest.mark.skipif(landlock.abi() < 1, reason="no Landlock here")))
    return out


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


def test_every_guard_refusal_of_the_integrity_suite_is_listed_here():
    """A fixture the guard refuses with the scan off (test_integrity.SCAN_OFF) is contained without it,
    or is named as the guard's alone."""
    from test_integrity import SCAN_OFF

    python = {n for n in SCAN_OFF if next(ATTACKS.glob(f"{n}.*")).suffix == ".py"}
    assert python <= set(CONTAINED) | GUARD_ONLY, python - set(CONTAINED) - GUARD_ONLY


@pytest.mark.parametrize("mechanism", mechanisms())
@pytest.mark.parametrize("name", sorted(CONTAINED))
def test_contained_with_the_guard_off(task, tmp_path, monkeypatch, mechanism, name):
    monkeypatch.setenv(isolation.ENV, mechanism)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    Path("/tmp/optagent_attack_write_file").unlink(missing_ok=True)
    scratch = tmp_path / "scratch"
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=False) if c.label == "smoke-1"]
    source, language = attack(name)
    result = SandboxEvaluator(task, "cpu", cases, timeout_s=90, scratch_root=scratch, static_scan=False,
                              guard=False).evaluate(source, language)
    try:
        assert result.isolation.mechanism.value == mechanism
        assert result.isolation.ro_fs
        problems = [why for check in CONTAINED[name] for why in [check(result, scratch)] if why]
        assert not problems, (problems, result.status.value, result.reason)
        take_down.reaped()  # the judge answered: its exit is waited for in the background; the candidate's was not
        assert not left_in(scratch), "a process of the candidate outlived its evaluation"
    finally:
        Path("/tmp/optagent_attack_write_file").unlink(missing_ok=True)
