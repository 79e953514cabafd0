"""A package's hooks module, checked against ``TaskHooks`` once and called only through ``Hooks``.

Runs only in worker processes: a hooks module imports torch and is the package's own code.
Every problem is one line that names the hooks file, raised as ``RuntimeError(f"{path}: ...")``
(the convention ``probe_task`` turns into a TaskError for ``optagent task validate``).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from optagent.protocols import HOOK_RULES, HookNeed, TaskHooks
from optagent.task import Manifest

MODULE_NAME = "optagent_task_hooks"  # guard.lock_imports drops it before candidate code loads


def protocol_params(name: str) -> list[str]:
    """The arguments the protocol passes to a hook, by name (self left out)."""
    return list(inspect.signature(getattr(TaskHooks, name)).parameters)[1:]


def _signature_problem(name: str, fn: Callable) -> Optional[str]:
    passed = protocol_params(name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: it is called and may fail then
        return None
    try:
        sig.bind(*passed)
    except TypeError:
        pass
    else:
        return None
    positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes = len(required) if len(required) > len(passed) else len(positional)
    shown = f"{name}({', '.join(passed)})"
    sig = sig.replace(return_annotation=sig.empty)  # the arguments are what is wrong
    if takes == len(passed):  # the count fits; a required keyword-only argument does not
        return f"{name}{sig} cannot be called as the protocol calls it: {shown}"
    return (f"{name}{sig} takes {takes} argument{'s' if takes != 1 else ''}, the protocol passes "
            f"{len(passed)}: {shown}")


def _cases_text(manifest: Manifest) -> str:
    kinds = [k for k, cases in (("[[smoke]]", manifest.smoke), ("[[hidden]]", manifest.hidden)) if cases]
    return " and ".join(kinds)


def hooks_problem(module: ModuleType, manifest: Manifest) -> Optional[str]:
    """The first way the module falls short of TaskHooks for this manifest, or None."""
    for name, rule in HOOK_RULES.items():
        fn = getattr(module, name, None)
        if fn is None:
            if rule.need is HookNeed.ALWAYS:
                return f"{name} is missing ({rule.purpose})"
            if rule.need is HookNeed.WITH_CASES and (manifest.smoke or manifest.hidden):
                return f"{name} is missing (needed by the {_cases_text(manifest)} cases in optagent.toml)"
            continue
        if not callable(fn):
            return f"{name} is a {type(fn).__name__}, not a function ({rule.purpose})"
        why = _signature_problem(name, fn)
        if why:
            return why
    return None


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(MODULE_NAME, None)
        raise RuntimeError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    except Exception as e:  # the package's code: whatever it raises is the package's problem
        sys.modules.pop(MODULE_NAME, None)
        first = (str(e).strip().splitlines() or [""])[0]
        raise RuntimeError(f"{path}: importing it failed: {type(e).__name__}: {first}") from None
    return module


class Hooks:
    """The one way the harness calls a package's hooks; optional ones answer None when absent."""

    def __init__(self, module: ModuleType, path: Path):
        self.module, self.path = module, path

    @classmethod
    def load(cls, path: Path, manifest: Manifest) -> "Hooks":
        module = _import(path)
        why = hooks_problem(module, manifest)
        if why:
            raise RuntimeError(f"{path}: {why}")
        return cls(module, path)

    def _optional(self, name: str) -> Optional[Callable]:
        return getattr(self.module, name, None)

    @property
    def measures_bytes(self) -> bool:
        return self._optional("bytes_moved") is not None

    @property
    def measures_flops(self) -> bool:
        return self._optional("flops") is not None

    def make_case(self, params: dict, device: str, seed: int) -> list:
        return list(self.module.make_case(params, device, seed))

    def reference(self, args: list, dtype: Any) -> list:
        return list(self.module.reference(args, dtype))

    def bytes_moved(self, args: list) -> Optional[int]:
        fn = self._optional("bytes_moved")
        return None if fn is None else int(fn(args))

    def flops(self, args: list) -> Optional[int]:
        fn = self._optional("flops")
        return None if fn is None else int(fn(args))

    def describe(self, args: list) -> Optional[str]:
        fn = self._optional("describe")
        return None if fn is None else str(fn(args))

    def probe_case(self, label: str, params: dict, device: str, outputs: list[int]) -> list:
        """Every hook once on one manifest case, each answer checked against the protocol; its args."""
        import torch

        def call(name: str, *args):
            try:
                return getattr(self.module, name)(*args)
            except Exception as e:
                first = (str(e).strip().splitlines() or [""])[0]
                raise RuntimeError(f"{self.path}: {name} raised {type(e).__name__} on case {label}: "
                                   f"{first}") from None

        def wrong(what: str) -> RuntimeError:
            return RuntimeError(f"{self.path}: {what} (case {label})")

        made = call("make_case", dict(params), device, 1)
        if not isinstance(made, (list, tuple)):
            raise wrong(f"make_case returned a {type(made).__name__}, not the run_kernel argument list")
        args = list(made)
        for i in outputs:
            if not 0 <= i < len(args):
                raise wrong(f"task.outputs in optagent.toml names argument {i}, make_case returns {len(args)}")
            if not isinstance(args[i], torch.Tensor):
                raise wrong(f"task.outputs in optagent.toml names argument {i}, make_case's argument {i} is "
                            f"not a tensor ({type(args[i]).__name__})")
        refs = call("reference", [a.clone() if isinstance(a, torch.Tensor) else a for a in args], torch.float64)
        if not isinstance(refs, (list, tuple)) or len(refs) != len(outputs):
            got = f"{len(refs)} item(s)" if isinstance(refs, (list, tuple)) else f"a {type(refs).__name__}"
            raise wrong(f"reference returned {got}, the protocol expects a list of {len(outputs)} tensor(s), "
                        f"one per output {list(outputs)}")
        for j, (i, ref) in enumerate(zip(outputs, refs)):
            if not isinstance(ref, torch.Tensor) or tuple(ref.shape) != tuple(args[i].shape):
                shape = tuple(ref.shape) if isinstance(ref, torch.Tensor) else f"a {type(ref).__name__}"
                raise wrong(f"reference's item {j} is {shape}, output #{i} is {tuple(args[i].shape)}")
        for name in ("bytes_moved", "flops"):
            if self._optional(name) is not None and _count(call(name, args)) is None:
                raise wrong(f"{name} returned {call(name, args)!r}, the protocol expects a non-negative int")
        if self._optional("describe") is not None and not isinstance(call("describe", args), str):
            raise wrong(f"describe returned {call('describe', args)!r}, the protocol expects a str")
        return args


def _count(value: Any) -> Optional[int]:
    """value as a non-negative whole number (an int, or a float or 0-d tensor holding one), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number >= 0 and number.is_integer() else None
