"""Compiler facts for kernels that never ran here: CPU mode compiles Triton's interpreted launches for the target.

On a machine without a GPU the kernels run under Triton's interpreter, which compiles nothing; yet Triton
can compile for a GPU it does not see (its ptxas and cuobjdump ship with it). So in CPU mode
``record_launches`` (installed before any candidate code exists) notes each jit function's launch
signature, and ``target_facts`` compiles those specialisations for compiler_facts.TARGET_ARCH (Hopper, the
contest's H200, as the CUDA backend's ``-arch=sm_90`` on a CPU) and reads ``cuobjdump -res-usage``:
registers, spills and shared memory (``KernelFacts.target`` says they were never run). This runs in the
candidate's process, inside its sandbox: it compiles the candidate's own code, and its facts inform the
planner, never a verdict.
"""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Iterator, Optional

from optagent.schema import KernelFacts
from optagent.worker.compiler_facts import TARGET_ARCH, occupancy, parse_res_usage

# A compile for the target costs ~2 s and only informs the planner: a few per process.
TARGET_KERNELS, TARGET_COMPILE_S = 6, 30.0

class _Launches:
    """Each jit function's launch signatures seen under the interpreter, in order, and their facts once compiled."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Any, dict, dict, dict, dict]] = {}  # key: (fn, signature, constexprs, attrs, options)
        self.facts: dict[str, Optional[KernelFacts]] = {}
        self.spent_s = 0.0
        self.jit: dict[Any, Any] = {}  # python function -> its JITFunction (the params' constexpr marks)
        self.pristine: list[tuple[Any, dict[str, Any]]] = []  # the language's objects before any interpretation


_LAUNCHES = _Launches()


def record_launches() -> None:
    """Note every interpreted launch's signature (CPU mode; called before any candidate code exists)."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    if getattr(original, "_optagent_records", False):
        return
    _LAUNCHES.pristine = [(obj, dict(vars(obj))) for obj in _language_objects()]

    def run(self, *args, grid, warmup, **kwargs):
        try:
            _note(self.fn, args, kwargs)
        except Exception:  # facts are for the planner: a launch we cannot describe still runs
            pass
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run._optagent_records = True  # type: ignore[attr-defined]
    InterpretedFunction.run = run


def _language_objects() -> list[Any]:
    """What the interpreter patches in Triton's language (and, for a call between jit functions, never puts
    back): its modules, and the tensor, dtype and descriptor classes."""
    import triton.language as tl

    modules = [m for key, m in list(sys.modules.items()) if key.startswith("triton.language") and m is not None]
    return modules + [tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base]


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """Triton's language as the compiler needs it, for the length of a compile: what the interpreter patched
    put back as it was before any interpretation, and the language's own jit functions (tl.sum, tl.cdiv: in
    interpreter mode InterpretedFunctions) lent as JITFunctions; then everything as the interpreter left it."""
    import triton
    import triton.compiler.code_generator  # noqa: F401  (imported while interpreting: gluon's import checks that)
    from triton.runtime.interpreter import InterpretedFunction

    undo: list[tuple[Any, str, Any]] = []  # (object, name, value to put back; _ABSENT to delete)

    def put(obj: Any, name: str, value: Any) -> None:
        undo.append((obj, name, vars(obj).get(name, _ABSENT)))
        if value is _ABSENT:
            delattr(obj, name)
        else:
            setattr(obj, name, value)

    try:
        for obj, before in _LAUNCHES.pristine:
            now = dict(vars(obj))
            for name in now.keys() - before.keys():
                put(obj, name, _ABSENT)
            for name, value in before.items():
                if now.get(name, _ABSENT) is not value and not name.startswith("__"):
                    put(obj, name, value)
        for obj in _language_objects():
            for name, value in list(vars(obj).items()):
                if isinstance(value, InterpretedFunction):
                    put(obj, name, _jit(value.fn))
        with triton.knobs.runtime.scope():  # the language answers differently while it thinks it interprets
            triton.knobs.runtime.interpret = False
            yield
    finally:
        for obj, name, value in reversed(undo):
            if value is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


_ABSENT = object()


def _jit(fn: Any) -> Any:
    """The function as Triton's compiler takes it: a JITFunction whose globals name JITFunctions, where the
    interpreter left InterpretedFunctions (the helpers a kernel calls)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    known = _LAUNCHES.jit.get(fn)
    if known is not None:
        return known
    scope = dict(fn.__globals__)
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__module__, copy.__qualname__ = fn.__module__, fn.__qualname__
    copy.__annotations__, copy.__kwdefaults__ = dict(fn.__annotations__), fn.__kwdefaults__  # tl.constexpr marks
    jit = _LAUNCHES.jit[fn] = JITFunction(copy)  # known before its helpers, which may name it in turn
    for name, value in fn.__globals__.items():
        if isinstance(value, InterpretedFunction):
            scope[name] = _jit(value.fn)
    return jit


def _note(fn: Any, args: tuple, kwargs: dict) -> None:
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    if len(_LAUNCHES.seen) >= 4 * TARGET_KERNELS:
        return
    jit = _jit(fn)
    names = [p.name for p in jit.params]
    bound = inspect.signature(fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(jit.params):
        value = bound.arguments[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = value
            continue
        kind, key = native_specialize_impl(BaseBackend, value, False, not p.do_not_specialize,
                                           not p.do_not_specialize_on_alignment)
        signature[p.name] = kind
        if kind == "constexpr":  # None, and an int of 1 that Triton specialises
            constexprs[(i,)] = value
        elif isinstance(key, str):
            attrs[(i,)] = BaseBackend.parse_attr(key)
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in kwargs}
    key = repr((fn.__qualname__, sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                sorted(options.items())))
    _LAUNCHES.seen.setdefault(key, (fn, signature, constexprs, attrs, options))


def _cuobjdump() -> Optional[str]:
    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    return str(tool) if tool.exists() else None


def _compile_for_target(fn: Any, signature: dict, constexprs: dict, attrs: dict, options: dict) -> Optional[KernelFacts]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with _compiling():
        compiled = triton.compile(ASTSource(_jit(fn), signature, constexprs, attrs),
                                  target=GPUTarget("cuda", TARGET_ARCH, 32), options=options)
    meta = compiled.metadata
    tool = _cuobjdump()
    found: list[KernelFacts] = []
    if tool is not None:
        with tempfile.TemporaryDirectory(prefix="optagent-facts-") as d:
            cubin = Path(d) / "kernel.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            proc = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, timeout=30)
            found = parse_res_usage(proc.stdout)
    usage = found[0] if found else None
    regs = usage.registers if usage else None
    warps, shared = getattr(meta, "num_warps", None), getattr(meta, "shared", None)
    return KernelFacts(name=str(getattr(meta, "name", fn.__name__)), source="triton", registers=regs,
                       spill_bytes=usage.spill_bytes if usage else None, shared_bytes=shared, warps=warps,
                       stages=getattr(meta, "num_stages", None), occupancy=occupancy(regs, shared, warps),
                       target=f"sm_{TARGET_ARCH}")


class _Overdue(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """An exception in this (the main) thread once `seconds` pass: ptxas on a huge unrolled kernel can take
    minutes, and facts must not cost a case its time limit. Elsewhere than the main thread: no deadline."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def overdue(signum, frame):
        raise _Overdue(f"the compile for the target took over {seconds:.0f} s")

    before = signal.signal(signal.SIGALRM, overdue)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.1))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def target_facts() -> list[KernelFacts]:
    """The launches seen so far, compiled for TARGET_ARCH (each specialisation once, within the process's
    allowance); [] where Triton cannot. Never fails a case: facts are for the planner, not the verdict."""
    out: dict[str, KernelFacts] = {}
    for key, (fn, signature, constexprs, attrs, options) in list(_LAUNCHES.seen.items()):
        if key not in _LAUNCHES.facts:
            if len(_LAUNCHES.facts) >= TARGET_KERNELS or _LAUNCHES.spent_s >= TARGET_COMPILE_S:
                continue
            t0 = time.monotonic()
            try:
                with _deadline(TARGET_COMPILE_S - _LAUNCHES.spent_s):
                    _LAUNCHES.facts[key] = _compile_for_target(fn, signature, constexprs, attrs, options)
            except Exception:  # the deadline's too: a compile that would not end costs the allowance, not the case
                _LAUNCHES.facts[key] = None
            _LAUNCHES.spent_s += time.monotonic() - t0
        facts = _LAUNCHES.facts[key]
        if facts is not None:
            out.setdefault(facts.name, facts)
    return list(out.values())
