"""The hooks module as a whole: ``optagent task validate`` checks it against TaskHooks in the
worker's probe and says what is missing or wrong in one line naming the file, exit 2.

One real ``task validate`` per kind of problem; the variants of each go through the same
checks in this process (``Hooks.load`` and ``Hooks.probe_case``, what the probe runs).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.protocols import HOOK_RULES, HookNeed, TaskHooks
from optagent.task import load_task
from optagent.worker.hooks import Hooks

from tiny_package import HOOKS, MANIFEST, tiny_package

SMOKE_ONLY = MANIFEST[:MANIFEST.index("[[hidden]]")]
NO_CASES = MANIFEST[:MANIFEST.index("[[smoke]]")]


def validate(pkg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", "task", "validate", str(pkg)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def one_line_error(proc: subprocess.CompletedProcess, path: Path) -> str:
    """What `task validate` said is wrong with path, checked to be one line, exit 2, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"optagent: error: {path}: "), err
    return err[len(f"optagent: error: {path}: "):]


def load_error(tmp_path: Path, hooks: str, manifest: str = MANIFEST) -> str:
    """What loading the hooks says is wrong, as the probe would report it (after the file's name)."""
    pkg = tiny_package(tmp_path / "pkg", hooks=hooks, manifest=manifest)
    task = load_task(pkg)
    with pytest.raises(RuntimeError) as e:
        Hooks.load(task.hooks_path, task.manifest)
    text = str(e.value)
    assert text.startswith(f"{task.hooks_path}: ") and "\n" not in text
    return text[len(f"{task.hooks_path}: "):]


def answer_error(tmp_path: Path, hooks: str = HOOKS, manifest: str = MANIFEST) -> str:
    """What the probe says of the hooks' answers on the first smoke case (after the file's name)."""
    task = load_task(tiny_package(tmp_path / "pkg", hooks=hooks, manifest=manifest))
    loaded = Hooks.load(task.hooks_path, task.manifest)
    with pytest.raises(RuntimeError) as e:
        loaded.probe_case("smoke-1", task.manifest.smoke[0], "cpu", task.manifest.outputs)
    assert str(e.value).startswith(f"{task.hooks_path}: ")
    return str(e.value)[len(f"{task.hooks_path}: "):]


def test_every_protocol_hook_has_a_rule():
    members = {n for n, _ in inspect.getmembers(TaskHooks, inspect.isfunction) if not n.startswith("_")}
    assert members == set(HOOK_RULES)
    assert {n for n, r in HOOK_RULES.items() if r.need is not HookNeed.OPTIONAL} == {"make_case", "reference"}


def test_a_complete_package_validates(tmp_path):
    proc = validate(tiny_package(tmp_path / "pkg"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok ") and "1 smoke / 1 hidden" in proc.stdout


def test_the_probe_reports_the_hooks_answers(tmp_path):
    from optagent.evaluation.evaluator import probe_task

    found = probe_task(load_task(tiny_package(tmp_path / "pkg")))
    assert [e.model_dump(exclude={"format_version"}) for e in found.extra] == [
        {"label": "smoke-1", "sizes": "n=4096", "bytes": 2 * 4096 * 4},
        {"label": "hidden-1", "sizes": "n=1000", "bytes": 2 * 1000 * 4}]


def test_optional_hooks_may_be_left_out(tmp_path):
    from optagent.evaluation.evaluator import probe_task

    bare = HOOKS[:HOOKS.index("def bytes_moved")]  # make_case and reference only
    found = probe_task(load_task(tiny_package(tmp_path / "pkg", hooks=bare)))
    # no describe: each argument under the contract's name; no bytes_moved: no floor
    assert [(r.sizes, r.bytes) for r in found.extra] == [("x 4096, out 4096, n=4096", None),
                                                          ("x 1000, out 1000, n=1000", None)]


def test_a_missing_required_hook_is_named_by_validate(tmp_path):
    pkg = tiny_package(tmp_path / "pkg", hooks=HOOKS.replace("def make_case(", "def _make_case("))
    assert one_line_error(validate(pkg), pkg / "optagent_hooks.py") == (
        "make_case is missing (needed by the [[smoke]] and [[hidden]] cases in optagent.toml)")


@pytest.mark.parametrize("hooks, manifest, said", [
    (HOOKS.replace("def make_case(", "def _make_case("), SMOKE_ONLY,
     "make_case is missing (needed by the [[smoke]] cases in optagent.toml)"),
    (HOOKS.replace("def reference(", "def _reference("), NO_CASES,
     "reference is missing (the judge's reference outputs and tolerance, on every case)"),
    (HOOKS + "\ndescribe = 'n'\n", MANIFEST,
     "describe is a str, not a function (the sizes column of tables; default: the first two shapes)"),
], ids=["make_case-smoke-only", "reference", "not-callable"])
def test_a_missing_required_hook_is_named(tmp_path, hooks, manifest, said):
    assert load_error(tmp_path, hooks, manifest) == said


def test_without_cases_make_case_is_not_required(tmp_path):
    task = load_task(tiny_package(tmp_path / "pkg", hooks=HOOKS.replace("def make_case(", "def _make_case("),
                                  manifest=NO_CASES))
    assert Hooks.load(task.hooks_path, task.manifest).measures_bytes


def test_a_wrong_signature_is_named_by_validate(tmp_path):
    pkg = tiny_package(tmp_path / "pkg", hooks=HOOKS.replace("def reference(args: list, dtype: torch.dtype)",
                                                             "def reference(args: list)"))
    assert one_line_error(validate(pkg), pkg / "optagent_hooks.py") == (
        "reference(args: list) takes 1 argument, the protocol passes 2: reference(args, dtype)")


@pytest.mark.parametrize("old, new, said", [
    ("def make_case(params: dict, device: str, seed: int)", "def make_case(params, device, seed, scale)",
     "make_case(params, device, seed, scale) takes 4 arguments, the protocol passes 3: "
     "make_case(params, device, seed)"),
    ("def bytes_moved(args: list)", "def bytes_moved()",
     "bytes_moved() takes 0 arguments, the protocol passes 1: bytes_moved(args)"),
    ("def describe(args: list)", "def describe(args: list, *, width)",
     "describe(args: list, *, width) cannot be called as the protocol calls it: describe(args)"),
], ids=["too-many", "too-few", "keyword-only"])
def test_a_wrong_signature_is_named(tmp_path, old, new, said):
    assert old in HOOKS
    assert load_error(tmp_path, HOOKS.replace(old, new)) == said


def test_signatures_the_protocol_can_call_pass(tmp_path):
    hooks = (HOOKS.replace("def flops(args: list)", "def flops(*args)")
             .replace("def describe(args: list)", "def describe(args, width=80)"))
    task = load_task(tiny_package(tmp_path / "pkg", hooks=hooks))
    assert Hooks.load(task.hooks_path, task.manifest).measures_flops


def test_a_hooks_file_that_fails_to_import_is_named_by_validate(tmp_path):
    pkg = tiny_package(tmp_path / "pkg", hooks="import torch\nimport no_such_module_for_optagent\n" + HOOKS)
    assert one_line_error(validate(pkg), pkg / "optagent_hooks.py") == (
        "importing it failed: ModuleNotFoundError: No module named 'no_such_module_for_optagent'")


@pytest.mark.parametrize("hooks, said", [
    (HOOKS + "\ndef broken(:\n    pass\n", f"syntax error at line {HOOKS.count(chr(10)) + 2}: "),
    ("raise RuntimeError('needs a GPU\\nsecond line')\n" + HOOKS, "importing it failed: RuntimeError: needs a GPU"),
], ids=["syntax-error", "raises"])
def test_a_hooks_file_that_fails_to_import_is_named(tmp_path, hooks, said):
    said_now = load_error(tmp_path, hooks)
    assert said_now.startswith(said) and "second line" not in said_now


def test_a_wrong_answer_is_named_by_validate(tmp_path):
    pkg = tiny_package(tmp_path / "pkg", hooks=HOOKS.replace("return [args[0].to(dtype) * 2 + 1]",
                                                             "return [args[0][:3].to(dtype)]"))
    assert one_line_error(validate(pkg), pkg / "optagent_hooks.py") == (
        "reference's item 0 is (3,), output #1 is (4096,) (case smoke-1)")


@pytest.mark.parametrize("old, new, said", [
    ("return [args[0].to(dtype) * 2 + 1]", "return args[0].to(dtype) * 2 + 1",
     "reference returned a Tensor, the protocol expects a list of 1 tensor(s), one per output [1] (case smoke-1)"),
    ('return f"n={args[2]}"', "return args[2]", "describe returned 4096, the protocol expects a str (case smoke-1)"),
    ("return 0", "return -1.5", "flops returned -1.5, the protocol expects a non-negative int (case smoke-1)"),
    ('n = int(params["n"])', 'n = int(params["length"])', "make_case raised KeyError on case smoke-1: 'length'"),
], ids=["reference-not-a-list", "describe-type", "flops-value", "make_case-raises"])
def test_a_wrong_answer_is_named(tmp_path, old, new, said):
    assert old in HOOKS
    assert answer_error(tmp_path, HOOKS.replace(old, new)) == said


def test_a_tuple_is_an_argument_list_too(tmp_path):
    made = 'return [torch.randn(n, generator=g).to(device), torch.full((n,), float("nan"), device=device), n]'
    assert made in HOOKS
    task = load_task(tiny_package(tmp_path / "pkg", hooks=HOOKS.replace(made, made.replace("[", "(", 1)[:-1] + ")")))
    args = Hooks.load(task.hooks_path, task.manifest).probe_case("smoke-1", {"n": 8}, "cpu", [1])
    assert isinstance(args, list) and len(args) == 3 and args[2] == 8


def test_outputs_the_cases_do_not_have_are_named(tmp_path):
    assert answer_error(tmp_path, manifest=MANIFEST.replace("outputs = [1]", "outputs = [2]")) == (
        "task.outputs in optagent.toml names argument 2, make_case's argument 2 is not a tensor (int) (case smoke-1)")
    assert answer_error(tmp_path / "b", manifest=MANIFEST.replace("outputs = [1]", "outputs = [5]")) == (
        "task.outputs in optagent.toml names argument 5, make_case returns 3 (case smoke-1)")
