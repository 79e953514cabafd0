"""Evaluator integrity: every cheating kernel in tests/attacks/ ends in its named verdict.

Each fixture is a complete kernel file whose docstring names its attack class and the
verdict it must get. The tests run the real evaluator (SandboxEvaluator, CPU, Triton
interpreter) on as few manifest cases as the class allows:

* static attacks are REJECTED by the scan before anything runs (instant);
* dynamic attacks (wrong, stale, partial or cached outputs, input mutation, overfitting,
  approximations, hangs, crashes) get INCORRECT / REJECTED / TIMEOUT / RUNTIME_ERROR
  from the worker and the judge;
* defence in depth: the harness attacks are run again with the static scan bypassed,
  so the run-time guard (guard.lock_imports: audit hook + import blocker) and the
  worker's checks must still stop them.

GPU-only classes (side streams, illegal memory accesses, time below the physical
floor) are ``@pytest.mark.gpu`` and run where CUDA is visible.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import optagent.evaluation.evaluator as evaluator_module
from attack_fixtures import ATTACKS, attack  # tests/ is on sys.path
from optagent.integrity import static_verdict
from optagent.secret_env import redact
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.worker.object_scan import scan_cuda_object
from optagent.schema import EvalResult, Language, Status, TimerKind
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]
FAKE_KEY = "sk-optagent-test-0123456789abcdefFAKE"

@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


@pytest.fixture(scope="module")
def cases(task):
    return {c.label: c for c in select_cases(task, "cpu", 0, None, hidden=True)}




def run(task, cases, name: str, labels=("smoke-1",), timeout: float = 90.0, scan: bool = True) -> EvalResult:
    source, language = attack(name)
    result = SandboxEvaluator(task, "cpu", [cases[label] for label in labels], timeout_s=timeout,
                              static_scan=scan).evaluate(source, language)
    EvalResult.model_validate_json(result.model_dump_json())  # every verdict is a valid record
    return result


def expect(result: EvalResult, status: Status, pattern: str) -> None:
    assert result.status is status, f"{result.status.value}: {result.reason}"
    assert re.search(pattern, result.reason or ""), result.reason


# ---------------------------------------------------------------------------- the fixtures themselves

def test_every_fixture_names_its_class_and_verdict():
    files = sorted(p for p in ATTACKS.iterdir() if p.suffix in (".py", ".cu"))
    assert len(files) >= 40
    for p in files:
        head = p.read_text()[:1200]
        assert "Attack class:" in head and "Expected verdict:" in head, p.name
    listed = set(STATIC) | set(DYNAMIC) | set(SCAN_OFF) | set(OBJECT) | set(TIMER) | GPU_ONLY | {"hang"} | ELSEWHERE
    assert {p.stem for p in files} <= listed, {p.stem for p in files} - listed


# Fixtures run by other modules: the parent as a deputy (test_deputy.py), the console (test_plain_text.py),
# the file system without bwrap (test_landlock.py), the kernel interface with the guard off (test_guard_off.py),
# library kernels (test_library_kernels.py).
ELSEWHERE = {"plant_fifo", "plant_symlink", "plant_module", "outputs_link", "console_markup", "write_outside", "ns_escape",
             "launder_copy", "later_calls_torch", "local_jit", "docstring_kernel"}


# ---------------------------------------------------------------------------- rejected before running

STATIC = {
    # calling the baseline or a library instead of a kernel
    "calls_flash_attn": r"imports flash_attn", "calls_flash_attn_ext": r"imports flash_attn_2_cuda",
    "calls_flashinfer": r"imports flashinfer", "calls_baseline": r"imports testcase_config",
    "calls_standin_runpy": r"imports runpy", "calls_sdpa": r"torch\.nn", "calls_sdpa_alias": r"torch\.nn",
    "torch_only": r"defines no triton kernel", "torch_decoy": r"computes with PyTorch on the host",
    # timer tricks
    "side_thread": r"imports threading", "side_thread_lowlevel": r"imports _thread", "side_stream": r"side stream",
    "native_thread": r"imports ctypes",
    "patch_perf_counter": r"imports time", "patch_cuda_event": r"patches torch\.cuda",
    "forge_timer_claim": r"imports optagent\.worker\.timers", "answer_when_saved": r"imports optagent\.worker",
    "patch_bench_clock": r"torch\.sys", "obf_alias_event": r"cuda\.Event",
    # harness attacks, plain and obfuscated
    "forge_result": r"imports os", "forge_with_nonce": r"imports json", "os_exit": r"imports os",
    "self_kill": r"imports os", "gc_reader": r"imports gc", "write_file": r"opens files \(open\)",
    "write_file_torch_save": r"torch\.save", "fork_bomb": r"imports os", "read_env": r"imports os",
    "read_parent_env": r"imports os", "obf_getattr_import": r"getattr|__import__", "scan_environ": r"imports os",
    "obf_builtins_importlib": r"__builtins__", "obf_globals": r"globals|environ", "obf_exec_base64": r"base64",
    "obf_exec_hex": r"exec", "obf_compile_eval": r"eval|compile", "obf_subclasses": r"interpreter internals",
    "obf_getattr_computed": r"computes an attribute name", "obf_torch_os": r"torch\.os",
    "obf_frame_walk": r"interpreter internals", "obf_format_string": r"format string",
    "obf_from_file": r"from_file",
    # the native timer's attacks (scan bypassed: TIMER below)
    "rebind_bench_globals": r"torch\.sys", "forge_case_ran": r"torch\.sys", "call_native_timer": r"torch\.sys",
    "replace_timer_eager": r"torch\.sys", "report_pipe_garbage": r"imports os", "records_dup2_relay": r"imports os",
    "mutate_input_unchecked": r"torch\.sys", "after_work_answer": r"torch\.sys",
    # CUDA: rejected from the source, before nvcc runs
    "cuda_system": r"runs other programs", "cuda_fopen": r"opens files", "cuda_getenv": r"reads the environment",
    "cuda_side_stream": r"side stream", "cuda_token_paste": r"token pasting", "cuda_line_splice": r"runs other programs",
    "cuda_constructor": r"when the library is loaded", "cuda_cublas": r"calls a library",
}


@pytest.mark.parametrize("name", sorted(STATIC))
def test_static_attack_is_rejected_before_running(task, cases, name):
    result = run(task, cases, name)
    expect(result, Status.REJECTED, r"^rejected before running: .*" + STATIC[name])
    assert result.cases == [] and result.wall_s < 5


# CUDA that the source scan lets through, refused from the compiled object's imports and code
OBJECT = {"cuda_open64": r"calls open64", "cuda_libc_system": r"calls __libc_system",
          "cuda_syscall_bytes": r"system calls directly"}
NEEDS_BINUTILS = pytest.mark.skipif(not all(shutil.which(t) for t in ("nvcc", "nm", "objdump")),
                                    reason="needs nvcc, nm and objdump")


@NEEDS_BINUTILS
@pytest.mark.parametrize("name", sorted(OBJECT))
def test_object_scan_refuses_what_the_source_scan_misses(task, cases, name):
    source, language = attack(name)
    assert static_verdict(source, language) is None  # the point: the source scan misses it
    result = run(task, cases, name)
    expect(result, Status.REJECTED, OBJECT[name])
    assert result.cases == []


@pytest.mark.parametrize("name, ok", [
    ("cudaMalloc", True), ("__cudaRegisterFunction", True), ("sqrtf", True), ("__expf_finite", True),
    ("fprintf", True), ("_ZSt4cerr", True), ("_ZTISt13runtime_error", True), ("__divti3", True),
    ("_ZNSt12system_errorD1Ev", True),
    ("open64", False), ("__libc_system", False), ("write", False), ("fopen", False), ("getenv", False),
    ("cudaStreamCreate", False), ("cudaLaunchHostFunc", False),
    ("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE", False),
    ("_ZNSt14basic_ifstreamIcSt11char_traitsIcEEC1EPKcSt13_Ios_Openmode", False)])
def test_object_scan_allowlist(name, ok):
    from optagent.worker.object_scan import allowed

    assert allowed(name) is ok


@NEEDS_BINUTILS
def test_object_scan_accepts_every_cuda_starter_and_strategy(tmp_path):
    honest = [p for pattern in ("tasks/*/starter/*.cu", "agent/search/strategies/*/*.cu") for p in ROOT.glob(pattern)]
    assert len(honest) >= 6
    for p in honest:
        obj = tmp_path / f"{p.parent.name}-{p.stem}.o"
        subprocess.run(["nvcc", "-c", "-arch=sm_90", "-Xcompiler", "-fPIC", "-O3", "-o", str(obj), str(p)],
                       check=True, capture_output=True, timeout=300)
        assert scan_cuda_object(str(obj)) is None, p


@NEEDS_BINUTILS
def test_build_all_builds_side_by_side_and_names_each_failure(tmp_path, monkeypatch):
    from optagent.worker.backends.cuda import build_all, cache_dir

    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path / "cache"))
    srcs = {}
    for name in ("starter", "broken", "cuda_system"):
        srcs[name] = tmp_path / name / f"{name}.cu"
        srcs[name].parent.mkdir()
    srcs["starter"].write_text((ROOT / "tasks/flashattn_task_package/starter/decode_cuda.cu").read_text())
    srcs["broken"].write_text(srcs["starter"].read_text().replace("run_kernel(", "run_kernel(undeclared_t x, ", 1))
    srcs["cuda_system"].write_text((ATTACKS / "cuda_system.cu").read_text())
    failed = build_all(list(srcs.values()), device="cpu")
    assert set(failed) == {srcs["broken"], srcs["cuda_system"]}
    assert "CompileError" in failed[srcs["broken"]] and "undeclared_t" in failed[srcs["broken"]]
    assert "Refused" in failed[srcs["cuda_system"]]
    assert len(list(cache_dir().glob("*.so"))) == 1  # only the one that built, and passed the check


def test_scan_accepts_every_starter_and_strategy():
    honest = [p for pattern in ("tasks/*/starter/*", "agent/search/strategies/**/*") for p in ROOT.glob(pattern)
              if p.suffix in (".py", ".cu") and p.name != "__init__.py"]
    assert any("flashattn_task_package" in str(p) for p in honest)
    for p in honest:
        language = Language.CUDA if p.suffix == ".cu" else Language.TRITON
        assert static_verdict(p.read_text(), language) is None, p


# ---------------------------------------------------------------------------- caught while running

DYNAMIC = {
    # name: (cases, status, reason pattern, marks)
    "partial_output": (["smoke-1"], Status.INCORRECT, r"not written or not finite", []),
    "stale_output": (["smoke-1"], Status.INCORRECT, r"256 of 256 output elements not written", []),
    "cache_by_pointer": (["smoke-1"], Status.INCORRECT, r"not written", []),
    "skip_timed_call": (["smoke-1"], Status.INCORRECT, r"not written", []),
    "timed_by_pointer": (["smoke-1"], Status.INCORRECT, r"not written", []),  # behaves differently when timed
    "finish_later": (["smoke-1"], Status.INCORRECT, r"not written", []),  # work moved after the timed calls
    "mutate_input": (["smoke-1"], Status.REJECTED, r"modified its input argument\(s\) \[0\]", []),
    "mutate_kv_workspace": (["smoke-1"], Status.REJECTED, r"modified its input argument\(s\) \[2\]", []),
    "overfit_seqlen": (["smoke-1", "hidden-1"], Status.INCORRECT, r"^case hidden-1: relative error", []),
    "overfit_block_table": (["smoke-1"], Status.INCORRECT, r"relative error", []),
    "overfit_page_multiple": (["smoke-1"], Status.INCORRECT, r"relative error", []),
    "known_seed": (["smoke-1"], Status.INCORRECT, r"relative error 1\.00e\+00", []),
    "skip_page": (["smoke-1", "hidden-4"], Status.INCORRECT, r"^case hidden-4: relative error .* exceeds", []),
    "approx": (["smoke-1"], Status.INCORRECT, r"relative error .* exceeds", []),
    "torch_decoy_elementwise": (["smoke-1"], Status.REJECTED, r"PyTorch", []),
    "illegal_access": (["smoke-1"], Status.RUNTIME_ERROR, r"SIGSEGV|SIGBUS|illegal|out of bounds", []),
    "print_flood": (["smoke-1"], Status.RUNTIME_ERROR, r"wrote over 64 MiB of output", []),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=v[3]) for n, v in sorted(DYNAMIC.items())])
def test_dynamic_attack_gets_its_verdict(task, cases, name):
    labels, status, pattern, _ = DYNAMIC[name]
    result = run(task, cases, name, labels)
    expect(result, status, pattern)
    if len(labels) > 1:  # the hidden case is what catches it: the contest-shaped smoke case passes
        assert result.cases[0].status is Status.PASSED and result.cases[1].status is status


def test_hang_times_out(task, cases):
    result = run(task, cases, "hang", timeout=20)
    expect(result, Status.TIMEOUT, r"did not finish within the 20 s limit")
    assert result.wall_s < 60


def test_honest_kernels_still_pass_under_the_guard(task, cases):
    """The scan and the audit guard leave the starter and the strategies alone (grouped-query case)."""
    honest = [ROOT / "tasks/flashattn_task_package/starter/decode_triton.py"]
    honest += sorted((ROOT / "agent/search/strategies/paged_decode").glob("*.py"))
    for path in honest:
        result = SandboxEvaluator(task, "cpu", [cases["smoke-2"]], timeout_s=180).evaluate(
            path.read_text(), Language.TRITON)
        assert result.status is Status.PASSED, (path.name, result.reason)


# ---------------------------------------------------------------------------- scan bypassed: run-time defences

SCAN_OFF = {
    # name: (status wanted, reason pattern, what must hold today, marks)
    "self_kill": (Status.REJECTED, r"signal processes.*\(os\.kill", []),
    "fork_bomb": (Status.REJECTED, r"fork processes.*\(os\.fork", []),
    "gc_reader": (Status.REJECTED, r"gc", []),
    "write_file": (Status.REJECTED, r"open a file.*\(open", []),
    "calls_standin_runpy": (Status.REJECTED, r"open a file", []),
    "calls_baseline": (Status.REJECTED, r"import(ing)? testcase_config", []),
    "obf_getattr_import": (Status.REJECTED, r"run other programs.*\(os\.system", []),
    "obf_exec_hex": (Status.REJECTED, r"run dynamic code.*\((exec|compile)", []),
    "obf_frame_walk": (Status.REJECTED, r"interpreter internals.*\(object\.__getattr__", []),
    "side_thread": (Status.REJECTED, r"tried to start a thread at run time", []),
    "patch_perf_counter": (Status.REJECTED, r"patched the harness's timers \(time\.perf_counter\)", []),
    "os_exit": (Status.REJECTED, r"exited with code 0|before the harness", []),
    "read_env": (Status.RUNTIME_ERROR, r"key=None", []),  # the worker's environment holds no keys
    "scan_environ": (Status.REJECTED, r"use the operating system.*\(os\.listdir: /proc", []),  # OS: test_isolation
    "torch_decoy": (Status.REJECTED, r"PyTorch", []),
    "forge_result": (Status.REJECTED, r"result channel", []),
    "forge_with_nonce": (Status.REJECTED, r"nonce|result channel|duplicate", []),
    "patch_bench_clock": (Status.REJECTED, r"timer|clock", []),
    "mutate_input_unchecked": (Status.REJECTED, r"modified its input argument\(s\) \[0\]", []),  # by the judge
    # the timer's records relayed through a pipe of the kernel's own: no record the parent can authenticate
    "records_dup2_relay": (Status.REJECTED, r"not written by the harness's timer|no eager timing record", []),
    # CUDA host code meets no audit hook: with the source scan off, the object scan stands
    "cuda_system": (Status.REJECTED, r"calls .*\bsystem\b", [NEEDS_BINUTILS]),
    "cuda_fopen": (Status.REJECTED, r"calls .*\bfopen\b", [NEEDS_BINUTILS]),
    "cuda_getenv": (Status.REJECTED, r"calls getenv", [NEEDS_BINUTILS]),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=v[2]) for n, v in sorted(SCAN_OFF.items())])
def test_runtime_defences_hold_without_the_scan(task, cases, name):
    status, pattern, _ = SCAN_OFF[name]
    for leftover in ("/tmp/optagent_attack_write_file",):
        Path(leftover).unlink(missing_ok=True)
    result = run(task, cases, name, scan=False)
    assert not Path("/tmp/optagent_attack_write_file").exists()
    assert result.status is status, result.reason
    assert re.search(pattern, result.reason or ""), result.reason


# ---------------------------------------------------------------------------- the native timer, scan bypassed

TIMER = {
    # name: (status, reason pattern); None: it passes, with the timer's own (honest) time
    "rebind_bench_globals": (Status.PASSED, None),
    "forge_case_ran": (Status.PASSED, None),
    "call_native_timer": (Status.REJECTED, r"an extra eager timing record"),
    "replace_timer_eager": (Status.REJECTED, r"no eager timing record from the harness's timer"),
    "report_pipe_garbage": (Status.REJECTED, r"report pipe carried \d+ line\(s\) not written by the harness's timer"),
    # on a CPU the referee's clock (evaluation/referee.py) sees the work first; on a GPU the timer's own interval
    "after_work_answer": (Status.REJECTED, r"passed between its timed calls \(eager loop\).*moved out of the timed "
                          r"window|the referee's own clock saw"),
}


@pytest.mark.parametrize("name", sorted(TIMER))
def test_native_timer_holds_against_a_rewritten_harness(task, cases, name):
    status, pattern = TIMER[name]
    result = run(task, cases, name, scan=False)
    assert result.timer is TimerKind.NATIVE
    assert result.status is status, result.reason
    if pattern:
        assert re.search(pattern, result.reason or ""), result.reason
    else:  # the forged or rebound figures said 0.001 us; a call under the interpreter takes milliseconds
        assert result.cases[0].time_us > 100, result.cases[0].time_us


def test_api_keys_never_reach_the_result(task, cases, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    for scan in (True, False):
        result = run(task, cases, "read_env", scan=scan)
        assert result.status is not Status.PASSED
        assert FAKE_KEY not in result.model_dump_json()


def test_parent_environment_is_out_of_reach(tmp_path):
    """read_parent_env with the scan bypassed, from an orchestrator whose own environment holds a key."""
    script = textwrap.dedent(f"""
        import optagent.evaluation.evaluator as E
        from optagent.task import load_task
        from optagent.schema import Language
        task = load_task({str(ROOT / 'tasks/flashattn_task_package')!r})
        cases = E.select_cases(task, "cpu", 0, None, hidden=False)[:1]
        src = open({str(ATTACKS / 'read_parent_env.py')!r}).read()
        print(E.SandboxEvaluator(task, "cpu", cases, timeout_s=90, static_scan=False).evaluate(src, Language.TRITON).model_dump_json())
    """)
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "OPTAGENT_SCRATCH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert FAKE_KEY not in out.stdout + out.stderr
    result = EvalResult.model_validate_json(out.stdout.strip().splitlines()[-1])
    assert result.status is not Status.PASSED
    # the audit guard refuses the open; in a PID namespace the parent is the sandbox's init, never reached
    pattern = r"found none" if result.isolation.pid_ns else r"open a file"
    assert re.search(pattern, result.reason or ""), result.reason


# ---------------------------------------------------------------------------- the run-time helpers

GUARD_SCRIPT = """
import json, os, sys
from optagent.worker.guard import lock_imports
found = []
guard = lock_imports(report=found.append)
code = open("candidate_probe.py").read()
results = {}
for name, snippet in json.loads(sys.argv[1]).items():
    try:
        exec(compile(snippet, os.path.abspath("candidate_probe.py"), "exec"), {"__name__": "optagent_candidate_x"})
        results[name] = "allowed"
    except PermissionError as e:
        results[name] = "refused: " + str(e)
    except ImportError as e:
        results[name] = "import refused: " + str(e)
print(json.dumps({"results": results, "reported": found}))
"""
PROBES = {
    "open": "open('/tmp/optagent_guard_probe', 'w')",
    "fork": "import os\nos.fork()",
    "kill": "import os\nos.kill(os.getpid(), 0)",
    "gc": "import gc\ngc.get_objects()",
    "frame": "import sys\nsys._getframe()",
    "subprocess": "import subprocess\nsubprocess.run(['true'])",
    "flash_attn": "import flash_attn",
    "dataclass": "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int = 1\nP()",
    "namedtuple": "import collections\ncollections.namedtuple('T', 'a b')(1, 2)",
    "math": "import math\nmath.exp(1.0)",
}


def test_audit_guard_refuses_candidate_actions_and_reports_them(tmp_path):
    Path("/tmp/optagent_guard_probe").unlink(missing_ok=True)
    (tmp_path / "candidate_probe.py").write_text("# placeholder: probes are compiled under this file name\n")
    out = subprocess.run([sys.executable, "-c", GUARD_SCRIPT, json.dumps(PROBES)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    res = got["results"]
    for name in ("open", "fork", "kill", "gc", "frame", "subprocess"):
        assert res[name].startswith("refused"), (name, res[name])
    assert res["flash_attn"].startswith("import refused")
    for name in ("dataclass", "namedtuple", "math"):  # allowed modules keep working
        assert res[name] == "allowed", (name, res[name])
    assert got["reported"] and got["reported"][0].startswith("tried to open a file")
    assert not Path("/tmp/optagent_guard_probe").exists()


LIBRARY_SPAWN_SCRIPT = """
import json, subprocess, sys
from optagent.worker.guard import lock_imports
found = []
lock_imports(report=found.append)
results = {}
for where, argv in json.loads(sys.argv[1]):  # code that stands in this file runs this program
    scope = {"subprocess": subprocess}
    exec(compile(f"def spawn():\\n    subprocess.run({argv!r}, capture_output=True)", where, "exec"), scope)
    try:
        scope["spawn"]()
        results[f"{where} {' '.join(argv)}"] = "allowed"
    except PermissionError:
        results[f"{where} {' '.join(argv)}"] = "refused"
print(json.dumps({"results": results, "reported": found}))
"""


def test_only_jit_compilers_and_library_lookups_may_run_programs(tmp_path):
    """TileLang (and its TVM) run nvcc as Triton runs ptxas, and libraries look up shared libraries
    with `ldconfig -p`; anything else asked to spawn is refused, and so is the candidate itself."""
    lib, true = "/opt/py/site-packages", ["true"]
    ldconfig = [shutil.which("ldconfig") or "/sbin/ldconfig", "-p"]
    allowed = [(f"{lib}/tilelang/contrib/nvcc.py", true), (f"{lib}/tilelang/3rdparty/tvm/python/tvm/contrib/nvcc.py", true),
               (f"{lib}/triton/runtime/build.py", true), (f"{lib}/cuda/pathfinder/find.py", ldconfig)]
    refused = [(f"{lib}/somelib/util.py", true), (f"{lib}/somelib/util.py", ldconfig[:1]),
               (str(tmp_path / "candidate_0.py"), true), (str(tmp_path / "candidate_0.py"), ldconfig)]
    out = subprocess.run([sys.executable, "-c", LIBRARY_SPAWN_SCRIPT, json.dumps(allowed + refused)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    assert got == {**{f"{w} {' '.join(a)}": "allowed" for w, a in allowed},
                   **{f"{w} {' '.join(a)}": "refused" for w, a in refused}}


WATCH_SCRIPT = """
import importlib.util, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import optagent_hooks as H
from optagent.worker.guard import watch_host_compute
found = {}
for path in sys.argv[2:]:
    spec = importlib.util.spec_from_file_location("optagent_candidate_w", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = H.make_case(dict(batch_size=2, seqlens=[17, 40], num_heads=4, num_heads_k=2, headdim=64), "cpu", 3)
    with watch_host_compute(args, [3]) as watch:
        module.run_kernel(*args)
    found[os.path.basename(path)] = watch.reason
print(json.dumps({"found": found, "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_watch_host_compute_tells_pytorch_from_a_kernel():
    honest = [ROOT / "tasks/flashattn_task_package/starter/decode_triton.py"]
    honest += sorted((ROOT / "agent/search/strategies/paged_decode").glob("*.py"))
    cheats = [ATTACKS / f"{n}.py" for n in ("torch_decoy", "torch_decoy_elementwise", "calls_sdpa", "torch_only")]
    out = subprocess.run([sys.executable, "-c", WATCH_SCRIPT, str(ROOT / "tasks/flashattn_task_package"),
                          *map(str, honest + cheats)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    found = got["found"]
    # the watch's dispatch mode is not wrapped in dynamo.disable: importing torch._dynamo cost
    # every candidate process seconds
    assert not got["dynamo"]
    for p in honest:
        assert found[p.name] is None, (p.name, found[p.name])
    for p in cheats:
        assert found[p.name] and "computes with PyTorch" in found[p.name], (p.name, found[p.name])


def test_redact_blanks_secret_values():
    env = {"OPENAI_API_KEY": FAKE_KEY, "HOME": "/root", "SHORT_TOKEN": "abc"}
    text = f"error: key {FAKE_KEY} in /root and abc"
    assert redact(text, env) == "error: key [redacted] in /root and abc"


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None, reason="needs nvcc and nm")
def test_compiled_object_symbols_catch_what_the_source_scan_cannot(tmp_path):
    """A backstop for backends/cuda.py: compile with -c, check the object's imports, then link."""
    clean = "__global__ void k(float* x) { x[0] = 1.0f; }\nextern \"C\" void run_kernel(float* x) { k<<<1, 1>>>(x); }\n"
    # `std::getenv` through a function pointer picked by template: the source names getenv only
    # inside a macro the regex scan would catch, so compile the object directly here.
    dirty = "#include <cstdlib>\n" + clean.replace("k<<<1, 1>>>(x);", "if (std::getenv(\"X\")) k<<<1, 1>>>(x);")
    verdicts = {}
    for name, src in (("clean", clean), ("dirty", dirty)):
        (tmp_path / f"{name}.cu").write_text(src)
        subprocess.run(["nvcc", "-c", "-arch=sm_90", "-Xcompiler", "-fPIC", "-o", str(tmp_path / f"{name}.o"),
                        str(tmp_path / f"{name}.cu")], check=True, capture_output=True, timeout=300)
        verdicts[name] = scan_cuda_object(str(tmp_path / f"{name}.o"))
    assert verdicts["clean"] is None
    assert verdicts["dirty"] and "getenv" in verdicts["dirty"]


# ---------------------------------------------------------------------------- GPU-only classes

GPU_ONLY = {"cuda_illegal_access", "graph_quarter_work"}
LARGE_CASE = "12"  # batch 16 x 16384 tokens: ~1 GB of K/V, a floor of a few hundred microseconds


def gpu_run(task, name: str, labels=("1",), scan: bool = True, timeout: float = 300) -> EvalResult:
    source, language = attack(name)
    specs = select_cases(task, "cuda", task_cases(task), ",".join(labels), hidden=False)
    return SandboxEvaluator(task, "cuda", specs, timeout_s=timeout, static_scan=scan).evaluate(source, language)


def task_cases(task) -> int:
    return len(evaluator_module.probe_task(task).cases)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["illegal_access", "cuda_illegal_access"])
def test_gpu_illegal_memory_access_is_a_runtime_error(task, name):
    result = gpu_run(task, name)
    expect(result, Status.RUNTIME_ERROR, r"illegal memory access|CUDA error|an illegal")


@pytest.mark.gpu
def test_gpu_side_stream_work_is_still_timed(task):
    """With the scan bypassed, work on a side stream is counted by the device-wide sync or rejected."""
    result = gpu_run(task, "side_stream", [LARGE_CASE], scan=False)
    if result.status is Status.PASSED:
        for c in result.timed:
            assert c.floor_us and c.time_us >= 0.9 * c.floor_us, (c.time_us, c.floor_us)
    else:
        assert result.status is Status.REJECTED, result.reason


@pytest.mark.gpu
def test_gpu_time_below_the_physical_floor_is_rejected(task):
    """patch_bench_clock with the scan bypassed: the slowed harness clock is seen as a patched timer,
    and the times it produced end below the floor; either names the trick."""
    result = gpu_run(task, "patch_bench_clock", [LARGE_CASE], scan=False)
    expect(result, Status.REJECTED, r"below the physical floor|patched the harness's timers \(optagent\.worker\.bench")


@pytest.mark.gpu
def test_gpu_work_moved_between_the_timed_calls_is_caught(task):
    """after_work_answer with the scan bypassed: the kernel runs in the rebound redraw, between timed
    calls. On decode the redraw costs more than the kernel, so the after-interval bound may not see
    it; the timed calls that do nothing then end below the floor. Either names the trick."""
    result = gpu_run(task, "after_work_answer", [LARGE_CASE], scan=False)
    expect(result, Status.REJECTED, r"moved out of the timed window|below the physical floor")
    honest = gpu_run(task, "rebind_bench_globals", [LARGE_CASE], scan=False)  # the starter's kernel, honest times
    assert honest.status is Status.PASSED, honest.reason
    for c in honest.timed:  # the harness's own after-work, as the timer saw it in both loops
        print(f"after-work case {c.case}: candidate {c.time.after_us:.0f} us, baseline {c.baseline.after_us:.0f} us")


@pytest.mark.gpu
def test_gpu_graph_doing_less_work_than_the_eager_call_gains_nothing_or_is_caught(task):
    """A graph that computes a quarter of the heads. By default replays are not timed (a display figure, never
    scored): it is timed and judged on its eager calls, which do all the work. With graph timing on, replays
    are checked like eager calls: the quarter leaves NaN."""
    source, language = attack("graph_quarter_work")
    specs = select_cases(task, "cuda", task_cases(task), LARGE_CASE, hidden=False)
    ev = SandboxEvaluator(task, "cuda", specs, timeout_s=300)
    result = ev.evaluate(source, language)
    assert result.timer is TimerKind.NATIVE
    assert result.status is Status.PASSED and all(c.gpu_us is None for c in result.timed), result.reason
    ev.timing = ev.timing.model_copy(update={"graphs": True})
    expect(ev.evaluate(source, language), Status.INCORRECT, r"not written")


@pytest.mark.gpu
def test_gpu_cached_and_skipped_timed_calls_are_caught(task):
    for name in ("cache_by_pointer", "stale_output", "partial_output"):
        result = gpu_run(task, name)
        expect(result, Status.INCORRECT, r"not written")


@pytest.mark.gpu
def test_gpu_honest_kernels_pass_under_the_guard(task):
    """Triton's compiler (ptxas, launcher builds) and nvcc run under the audit guard."""
    specs = select_cases(task, "cuda", task_cases(task), "1", hidden=True)
    for language in (Language.TRITON, Language.CUDA):
        result = SandboxEvaluator(task, "cuda", specs, timeout_s=600).evaluate(task.starter(language).source,
                                                                              language)
        assert result.status is Status.PASSED, (language, result.reason)


@pytest.mark.gpu
def test_gpu_a_kernel_that_works_only_when_not_timed_is_caught(task):
    """On the GPU too (more timed calls, a graph-replay loop): the timed calls it picks are judged.
    (finish_later is not here: on the H200 (2026-12-02) it PASSED at the starter's speed, because with three
    rotated input sets each timed call still launches one call's work, for the set timed before it, so
    nothing left the timed window; on the CPU's few calls the last one's work never runs: INCORRECT.)"""
    result = gpu_run(task, "timed_by_pointer", ["1", LARGE_CASE])
    expect(result, Status.INCORRECT, r"not written|relative error")
