"""Run-time guards of the candidate process (the static scan is ``checks``).

``lock_imports`` installs an import blocker and a PEP 578 audit hook (Python
code cannot remove one) that refuse process, file, frame and gc access made by
the candidate's own code and report it as an integrity violation;
``watch_host_compute`` tells a kernel from PyTorch doing the work.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import threading
from importlib.abc import MetaPathFinder
from typing import Callable, Optional

from optagent.integrity import LIBRARIES, table

# The whole optagent package, not only this folder: the harness calls into optagent's shared records too.
OPTAGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _importer_is_candidate() -> bool:
    """Whether the import statement being served stands in the candidate's own file."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename == __file__ or f.f_code.co_filename.startswith("<frozen")):
        f = f.f_back
    if f is None:
        return False
    name = os.path.abspath(f.f_code.co_filename)
    here = OPTAGENT_ROOT
    return not name.startswith(here) and (name.startswith(os.path.abspath(os.getcwd()) + os.sep)
                                          or os.path.basename(name).startswith("candidate"))


class ImportBlocker(MetaPathFinder):
    """Refuses, inside the candidate process, the libraries (and harness modules) a kernel must not call."""

    def __init__(self, report: Optional[Callable[[str], None]] = None):
        self.report = report

    def find_spec(self, fullname, path=None, target=None):
        if LIBRARIES.match(fullname.split(".")[0]) and _importer_is_candidate():
            if self.report is not None:
                self.report(f"tried to import {fullname} at run time")
            raise ImportError(f"optagent: importing {fullname} is not allowed in a candidate kernel")
        # Libraries probe optional modules (torch's importlib.util.find_spec("tensorrt")): not ours to refuse.
        return None


# Audit events (PEP 578). Raised by the candidate's own code: refused (a kernel needs none).
# Raised in torch/triton: allowed, except gc, signals, sockets, tracing, spawning (the JIT
# compilers' own ptxas/nvcc/launcher builds excepted: Triton's, TileLang's and its TVM's),
# and reading another process's environment or memory or the job file (seed, nonce).
# optagent's own frames are trusted. ctypes.call_function is skipped: it fires on every call
# of a CUDA candidate (and a candidate cannot get a foreign function without the refused
# ctypes.dlopen/dlsym).
EVENT_WHY = table({  # the longest matching prefix names what the event does
    "signal processes": "os.kill os.killpg signal.", "fork processes": "os.fork os.forkpty", "open a file": "open",
    "run other programs": "os.system os.exec os.spawn os.posix_spawn subprocess. pty.", "touch files": "shutil. glob.",
    "use the operating system": "os. tempfile.", "call native code": "ctypes.", "reach into the interpreter": "sys.",
    "read the harness's objects through gc": "gc.", "reach into interpreter internals": "object.",
    "run dynamic code": "exec compile marshal. pickle. code. function.", "open a network connection": "socket.",
    "read stdin": "builtins.input", "start a thread": "_thread."})
EVENT_PREFIXES = tuple(EVENT_WHY)
ALWAYS_REFUSED = ("gc.", "os.kill", "os.killpg", "socket.", "signal.pthread_kill", "sys._current_frames",
                  "sys.settrace", "sys.setprofile")
# Path parts that mark a JIT compiler's frames (TileLang vendors TVM under tilelang/3rdparty/tvm).
COMPILERS = tuple(f"{os.sep}{name}{os.sep}" for name in ("triton", "tilelang", "tvm", "tvm_ffi"))
SPAWN = ("subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "pty.")
SECRET_PATH = re.compile(r"/proc/[^/]+/(environ|mem)$|(^|/)job-\w+\.json$")
# Allowed stdlib modules that build code for the candidate (@dataclass, namedtuple) exec it and
# read function signatures; only that is let through (copy.copy, which calls whatever a
# __reduce_ex__ returns, is no helper: its events count as the candidate's).
STDLIB_HELPERS = tuple(os.sep + f for f in ("dataclasses.py", "typing.py", "enum.py",
                                            "collections" + os.sep + "__init__.py"))
HELPER_EVENTS = ("exec", "compile", "sys._getframe")
HELPER_ATTRS = {"__code__", "__defaults__", "__kwdefaults__", "__doc__", "__module__", "__qualname__", "__name__"}


class AuditGuard:
    def __init__(self, report: Optional[Callable[[str], None]] = None):
        self.report, self.violations, self.busy, self.pid = report, [], set(), os.getpid()
        paths = sysconfig.get_paths()
        self.stdlib = tuple({paths["stdlib"], paths["platstdlib"]})
        self.site = tuple({paths["purelib"], paths["platlib"]})
        self.scratch = os.path.abspath(os.getcwd()) + os.sep  # the worker runs in its scratch directory
        self.optagent = OPTAGENT_ROOT

    def origin(self) -> tuple[str, bool]:
        """Whose code raised the event ('candidate', 'optagent', 'triton' or 'library'; stdlib frames
        skipped), and whether an allowed stdlib helper (@dataclass, namedtuple...) stood in between."""
        f, helper, code_seen = sys._getframe(1), False, False
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back  # the guard's own frames
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<frozen importlib"):
                return "library", helper  # loading a module the candidate imported: the import rules judged that
            code_seen = code_seen or name.startswith("<")  # code built at run time cannot borrow a helper's rights
            helper = helper or (name.endswith(STDLIB_HELPERS) and not code_seen)
            if not (name.startswith("<") or (name.startswith(self.stdlib) and not name.startswith(self.site))):
                if name.startswith(self.optagent):  # first: the harness's own candidate.py is not a candidate
                    return "optagent", helper
                if name.startswith(self.scratch) or os.path.basename(name).startswith("candidate"):
                    return "candidate", helper
                return ("compiler" if any(c in name for c in COMPILERS) else "library"), helper
            f = f.f_back
        return "library", helper

    def refused(self, event: str, args: tuple) -> bool:
        who, helper = self.origin()
        first = args[0] if args else None
        if who == "candidate":  # its own code raises no audited event, bar what helpers do for it
            attr = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            own = str(getattr(first, "__module__", "")).startswith("optagent_candidate")
            return not ((event == "object.__setattr__" and (own or (helper and attr in HELPER_ATTRS)))
                        or (helper and (event in HELPER_EVENTS
                                        or (event == "object.__getattr__" and attr in HELPER_ATTRS))))
        return who != "optagent" and (bool(event == "open" and SECRET_PATH.search(str(first)))
                                      or event.startswith(ALWAYS_REFUSED)
                                      or (event.startswith(SPAWN) and who != "compiler"
                                          and not _library_lookup(event, args)))

    def __call__(self, event: str, args: tuple) -> None:
        if not event.startswith(EVENT_PREFIXES) or event == "ctypes.call_function" or os.getpid() != self.pid:
            return  # cheap exit; a forked child is not ours to judge
        key = threading.get_ident()
        if key in self.busy:
            return  # origin() raises sys._getframe itself
        self.busy.add(key)
        try:
            refused = self.refused(event, args)
        except Exception:  # a bug here must not break honest kernels: the scan and the worker still stand
            refused = False
        finally:
            self.busy.discard(key)
        if refused:
            verb = EVENT_WHY[max((p for p in EVENT_PREFIXES if event.startswith(p)), key=len)]
            target = str(args[0])[:80] if args and isinstance(args[0], (str, bytes, int, os.PathLike)) else ""
            why = f"tried to {verb} at run time ({event}{': ' + target if target else ''})"
            if not self.violations and self.report is not None:
                self.report(why)
            self.violations.append(why)
            raise PermissionError(f"optagent: a candidate kernel may not {verb} ({event})")


def _library_lookup(event: str, args: tuple) -> bool:
    """`ldconfig -p`: how libraries locate a shared library (ctypes.util.find_library, CUDA
    bindings); it only reads the loader's cache. Allowed to library code, never to the candidate."""
    if event != "subprocess.Popen" or len(args) < 2:
        return False
    argv = [str(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
    return os.path.basename(str(args[0] or (argv[0] if argv else ""))) == "ldconfig" and argv[1:] == ["-p"]


_GUARD: Optional[AuditGuard] = None


def lock_imports(report: Optional[Callable[[str], None]] = None) -> AuditGuard:
    """Lock the candidate process down before candidate code loads (call it in the scratch directory).

    Drops the libraries and the package's modules (testcase_config, the hooks' reference)
    from sys.modules, blocks importing them again, and installs the audit guard. ``report``
    (the worker's integrity channel) hears the first violation, so that a candidate that
    catches the PermissionError is still rejected.
    """
    global _GUARD
    for name in list(sys.modules):
        if LIBRARIES.match(name.split(".")[0]) and name.split(".")[0] != "optagent":
            del sys.modules[name]
    sys.meta_path.insert(0, ImportBlocker(report))
    if _GUARD is None:
        _GUARD = AuditGuard(report)
        sys.addaudithook(_GUARD)
        _audit_thread_starts(_GUARD)
    return _GUARD


def _audit_thread_starts(guard: AuditGuard) -> None:
    """Before Python 3.13 starting a thread raises no audit event: wrap the starters so that
    it does (a thread that runs the kernel after run_kernel returned may have died before the
    end-of-case thread count looks)."""
    import _thread

    for module, name in ((_thread, "start_new_thread"), (threading, "_start_new_thread"),
                         (_thread, "start_joinable_thread"), (threading, "_start_joinable_thread")):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_optagent_audited", False):
            continue

        def start(function, *args, _original=original, **kwargs):
            guard("_thread.start_new_thread", (function,))
            return _original(function, *args, **kwargs)

        start._optagent_audited = True  # type: ignore[attr-defined]
        setattr(module, name, start)


# aten ops that move or view data without computing on it (the CPU interpreter's copies among them).
PASSTHROUGH = re.compile(r"aten\.(empty|new_empty|empty_like|empty_strided|new_empty_strided|zeros|zero_|fill_|full|"
                         r"copy_|_to_copy|clone|contiguous|view|_unsafe_view|as_strided|alias|detach|set_|slice|"
                         r"select|unsqueeze|squeeze|permute|transpose|t|expand|reshape|lift_fresh|_local_scalar_dense|"
                         r"is_same_size|sym_\w+)\b")


def watch_host_compute(args: list, outputs: list[int]):
    """Around one untimed run_kernel call: did PyTorch, not the candidate's kernel, compute on the inputs?

    The big floating inputs (K and V here) are tainted, and so is what is copied or viewed
    from them; any other aten op that reads tainted data is PyTorch doing the work (kernel
    launches issue no aten ops). Use as ``with watch_host_compute(args, outs) as w: fn(*args)``;
    ``w.reason`` then says what was found, or is None.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def storages(tree) -> list[int]:
        return [t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(tree)
                if isinstance(t, torch.Tensor)]

    floats = [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point() and i not in outputs]
    top = max((a.numel() for a in floats), default=0)

    def big(tree) -> list[int]:
        """Floating tensors the size of an input (a new buffer an input may be copied into, by any kernel)."""
        return [t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(tree)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and top and t.numel() * 8 >= top]

    class Watch(TorchDispatchMode):
        tainted = {a.untyped_storage().data_ptr() for a in floats if a.numel() * 8 >= top}
        reason: Optional[str] = None

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # Else PyTorch wraps __torch_dispatch__ in dynamo.disable, whose first call imports
            # torch._dynamo: 2.5-5 s of every candidate process. Nothing in it is compiled (the
            # scan refuses torch.compile and torch._dynamo), so there is nothing to keep out.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if PASSTHROUGH.match(str(func)):  # a buffer as big as an input: a Triton copy launders nothing into it
                self.tainted.update(big(out))
            if any(p in self.tainted for p in storages((args, kwargs))):
                if PASSTHROUGH.match(str(func)):  # copies and views of tainted data stay tainted
                    self.tainted.update(storages(out) + (storages(args[0]) if str(func).startswith("aten.copy_") else []))
                elif self.reason is None:
                    self.reason = f"computes with PyTorch on its inputs ({func}) instead of in its own kernel"
            return out

    return Watch()
