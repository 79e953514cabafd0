"""Integrity rules of the candidate process: a static scan, import blocking, an audit guard.

The static scan names the forbidden thing before any code runs. Rather than list
bad calls (a list is dodged by ``getattr(__import__('o'+'s'), ...)``), it bounds
what a kernel file can reach at all: imports from an allowlist; no dynamic code,
no computed attribute names, no dunders or frame attributes, no patching of
modules; and host code (outside ``@triton.jit``) may not compute the attention
itself with PyTorch math. What gets past the scan meets ``lock_imports``: an
import blocker and a PEP 578 audit hook, which Python code cannot remove, that
refuses process, file, frame and gc access made by the candidate's own code.
The dynamic checks in the worker and the judge are what a score rests on.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import sysconfig
import threading
from importlib.abc import MetaPathFinder
from typing import Callable, Optional

from .schema import Language

# Libraries that would compute the answer for the candidate, and the harness itself
# (a prefix match: flash_attn_2_cuda and flash_attn_interface are FlashAttention too).
LIBRARIES = re.compile(r"(flash_?attn|flashinfer|flash_mla|xformers|vllm|sgl_kernel|sglang|deep_gemm|apex|"
                       r"transformer_engine|liger_kernel|flag_gems|triton_kernels|tensorrt|torch_tensorrt|"
                       r"testcase_config|optagent)")
FORBIDDEN_MODULES = ("flash_attn", "flashinfer", "xformers", "vllm", "sgl_kernel", "sglang", "deep_gemm",
                     "flash_mla", "testcase_config", "optagent_task_hooks", "optagent")  # kept for importers
# A kernel file needs nothing else; every other module is refused, with a reason for the known-bad ones.
ALLOWED_IMPORTS = {"__future__", "math", "cmath", "typing", "typing_extensions", "functools", "itertools",
                   "dataclasses", "enum", "collections", "numbers", "abc", "warnings", "copy", "torch", "triton",
                   "tilelang"}
_W = {"processes, files and the environment": "os posix nt", "reaches into the interpreter": "sys",
      "reads the harness's objects": "gc", "inspects the caller's frames": "inspect traceback",
      "runs other processes": "subprocess multiprocessing pty", "starts background threads":
      "threading _thread concurrent asyncio sched", "opens network connections": "socket ssl http urllib requests",
      "installs signal handlers": "signal", "calls native code directly": "ctypes cffi _ctypes",
      "imports modules dynamically": "importlib imp runpy pkgutil zipimport", "patches builtins": "builtins",
      "touches files": "shutil pathlib io tempfile glob fcntl mmap fileinput", "touches the clock": "time timeit",
      "decodes hidden code or data": "pickle marshal dill base64 binascii codecs zlib bz2 lzma",
      "builds code at run time": "code codeop types ast dis", "runs code after the checks": "atexit",
      "computes on the host instead of a kernel": "numpy scipy jax"}
MODULE_WHY = {m: why for why, mods in _W.items() for m in mods.split()}

# Attributes no kernel touches, whatever object they are reached through (torch.os,
# triton.runtime.jit.sys...): process, environment, frames, files, timers, streams.
FORBIDDEN_ATTRS = {a: why for why, attrs in {
    "reaches a module it may not import": "os posix sys gc inspect subprocess multiprocessing threading _thread "
                                          "ctypes importlib builtins shutil pathlib socket runpy pickle marshal",
    "touches processes or the environment": "environ environb getenv putenv unsetenv _exit system popen fork "
                                            "forkpty kill killpg execv execve execvp execvpe execl execle execlp "
                                            "spawnv spawnve posix_spawn posix_spawnp",
    "inspects frames or the interpreter": "_getframe _current_frames settrace setprofile meta_path path_hooks "
                                          "modules addaudithook f_back f_globals f_locals f_builtins f_code "
                                          "tb_frame tb_next gi_frame gi_code cr_frame ag_frame co_code co_consts",
    "reads or writes files": "save from_file tofile fromfile load_library load_inline cpp_extension",
    "touches the timer": "perf_counter perf_counter_ns monotonic elapsed_time Event",
    "launches on a side stream or captures graphs": "Stream ExternalStream stream set_stream streams graph "
                                                    "graphs CUDAGraph",
    "uses private interpreter bindings": "_C _dynamo _inductor",
}.items() for a in attrs.split()}
# torch.X for these X: libraries, code loading and compilation, files, dispatch hooks.
TORCH_FORBIDDEN = set("load save from_file compile export hub utils package classes library ops jit "
                      "multiprocessing distributed profiler nn special linalg func fx overrides backends".split())
# PyTorch math that computes attention on the host (outside a kernel); math.exp is fine.
TORCH_MATH = set("softmax log_softmax matmul bmm baddbmm mm addmm addbmm einsum tensordot exp exp_ exp2 expm1 "
                 "logsumexp sigmoid scaled_dot_product_attention numpy".split())
ALLOWED_DUNDERS = {"__init__", "__name__", "__qualname__", "__doc__", "__call__", "__len__", "__getitem__",
                   "__setitem__", "__iter__", "__next__", "__enter__", "__exit__", "__repr__", "__str__", "__eq__",
                   "__hash__", "__post_init__"}
FORBIDDEN_NAMES = {"__import__": "imports modules dynamically (__import__)", "exec": "executes dynamic code (exec)",
                   "eval": "evaluates dynamic code (eval)", "compile": "compiles dynamic code (compile)",
                   "open": "opens files (open)", "globals": "reads module namespaces (globals)",
                   "locals": "reads frame namespaces (locals)", "vars": "reads object namespaces (vars)",
                   "setattr": "patches attributes (setattr)", "delattr": "patches attributes (delattr)",
                   "breakpoint": "starts a debugger", "input": "reads stdin", "__builtins__": "touches __builtins__",
                   "__loader__": "touches __loader__", "__spec__": "touches __spec__"}
JIT_DECORATORS = {"jit", "autotune", "heuristics", "prim_func", "macro"}
# str.format can walk attributes too: "{0.__globals__}".format(f).
FORMAT_ATTR = re.compile(r"\{[^{}]*\.(_\w*|f_\w+|tb_\w+)")


def _parts(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """a.b.c -> ['<resolved a>', 'b', 'c'] (imports resolved); '?' for a root that is not a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    root = aliases.get(node.id, node.id) if isinstance(node, ast.Name) else "?"
    return root.split(".") + list(reversed(parts))


def _chain_why(parts: list[str], host: bool, imported: bool) -> Optional[str]:
    """Why a dotted access is refused; ``imported`` when its root is an imported module."""
    name = ".".join(parts)
    for p in parts[1:]:
        if p.startswith("__") and p.endswith("__") and p not in ALLOWED_DUNDERS:
            return f"reaches into interpreter internals ({name})"
        if p in FORBIDDEN_ATTRS:
            return f"{FORBIDDEN_ATTRS[p]} ({name})"
        if imported and p.startswith("_") and parts[0] in ("torch", "triton"):
            return f"uses private internals ({name})"
    if imported and parts[0] == "torch" and len(parts) > 1 and parts[1] in TORCH_FORBIDDEN:
        return f"uses {'.'.join(parts[:2])}, which a kernel file may not use ({name})"
    if host and parts[0] not in ("math", "cmath", "triton") and any(p in TORCH_MATH for p in parts[1:]):
        return f"computes with PyTorch on the host ({name}) instead of in its own kernel"
    return None


def _jit_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a @triton.jit / autotune / prim_func function (device code)."""
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in fn.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                last = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
                if last in JIT_DECORATORS:
                    inside.update(id(n) for n in ast.walk(fn))
                    break
    return inside


def scan_python(source: str) -> Optional[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # the backend reports it as COMPILE_ERROR with the line
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                return "uses a relative import (a kernel file stands alone)"
            base = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                root = full.split(".")[0]
                if LIBRARIES.match(root):
                    return f"imports {full} (a library or the harness, not a kernel)"
                if root not in ALLOWED_IMPORTS:
                    why = MODULE_WHY.get(root, "is not needed by a kernel")
                    return (f"imports {root} ({why}); a kernel file may import only "
                            f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}")
                if alias.name == "*":
                    return f"uses `from {base} import *` (names must be visible to the scan)"
                why = _chain_why(full.split("."), host=True, imported=True)
                if why and root != "__future__":
                    return why
                aliases[alias.asname or (alias.name if base else root)] = full if (alias.asname or base) else root
    device = _jit_nodes(tree)
    call_funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        host = id(node) not in device
        if isinstance(node, ast.Name):
            if node.id == "getattr" and id(node) not in call_funcs:
                return "passes getattr around (attribute names must be visible to the scan)"
            if node.id in FORBIDDEN_NAMES and node.id not in aliases:
                return FORBIDDEN_NAMES[node.id]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                return "computes an attribute name at run time (getattr with a non-literal name)"
            base = _parts(node.args[0], aliases)
            why = _chain_why(base + [node.args[1].value], host, base[0] in aliases.values() or base[0] == "torch")
            if why:
                return why
        elif isinstance(node, ast.Attribute):
            parts = _parts(node, aliases)
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            imported = isinstance(root, ast.Name) and root.id in aliases
            why = _chain_why(parts, host, imported)
            if why:
                return why
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute):
                        root = sub
                        while isinstance(root, (ast.Attribute, ast.Subscript)):
                            root = root.value
                        if isinstance(root, ast.Name) and root.id in aliases:
                            return f"patches {'.'.join(_parts(sub, aliases))} (a kernel never changes library state)"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and host:
            return "computes with PyTorch on the host (the @ operator) instead of in its own kernel"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and FORMAT_ATTR.search(node.value):
            return "walks attributes through a format string"
    return None


# CUDA: comments removed and line continuations spliced before matching, so that
# `sys\<newline>tem(` reads as what the compiler sees; token pasting is refused.
CUDA_FORBIDDEN = {
    r"##|%:%:": "builds identifiers by token pasting (##), which hides what the code calls",
    r"\\[uU][0-9a-fA-F]{4}": "spells identifiers with universal character names",
    r"\b(?:system|popen|fork|vfork|posix_spawnp?|exec[lv]p?e?|clone)\b": "runs other programs",
    r"\b(?:dlopen|dlsym|dlmopen|dlvsym)\b": "loads libraries at run time",
    r"\b(?:getenv|secure_getenv|setenv|putenv|environ|__environ)\b": "reads the environment",
    r"\b(?:fopen|freopen|fdopen|tmpfile|mkstemp|open|openat|creat|unlink|rename|mkdir)\s*\(|"
    r"\b(?:[io]?fstream|filebuf|filesystem)\b": "opens files",
    r"\b(?:_exit|_Exit|exit|quick_exit|abort)\s*\(": "exits the process",
    r"\bstd::thread\b|\bstd::async\b|\bstd::jthread\b|\bpthread_create\b|#\s*pragma\s+omp": "starts background threads",
    r"\b(?:kill|killpg|raise|signal|sigaction)\s*\(": "signals processes",
    r"\b(?:syscall|ptrace|prctl|mprotect|socket|connect)\b": "makes system calls directly",
    r"\bcudaStreamCreate\w*|\bcuStreamCreate\w*": "launches on a side stream",
    r"\bcudaLaunchHostFunc\b|\bcudaStreamAddCallback\b": "runs host callbacks outside the timed call",
    r"\bcudaDeviceReset\b|\bcudaSetDevice\b|\bcudaIpc\w+": "resets, switches or shares the device",
    r"__attribute__\s*\(\(\s*constructor": "runs code when the library is loaded",
    r"#\s*include\s*[<\"](?:/|\.\.|unistd|sys/|fcntl|dlfcn|spawn|signal|csignal|thread|future|fstream|"
    r"filesystem|pthread|Python|pybind11|torch/|ATen/|c10/)": "includes a system or framework header a kernel does not need",
    r"/proc/|\.\./": "names paths outside its scratch directory",
    r"cublas|cudnn|flash_?attn|flashinfer|cutlass/|\bcub::DeviceSegmented": "calls a library instead of a kernel",
}
# Undefined symbols of the candidate's own object file (nvcc -c), a backstop for what
# the source scan cannot see; the static cudart linked later imports many of these itself.
CUDA_FORBIDDEN_SYMBOLS = set("system popen fork vfork execv execve execvp execvpe execl execlp execle posix_spawn "
                             "posix_spawnp clone getenv secure_getenv setenv putenv environ __environ fopen fopen64 "
                             "freopen fdopen tmpfile mkstemp open open64 openat creat unlink rename mkdir dlopen "
                             "dlsym dlmopen dlvsym pthread_create kill killpg raise signal sigaction syscall ptrace "
                             "prctl mprotect socket connect _exit _Exit exit quick_exit abort cudaStreamCreate "
                             "cudaStreamCreateWithFlags cudaStreamCreateWithPriority cuStreamCreate "
                             "cudaLaunchHostFunc cudaStreamAddCallback cudaDeviceReset cudaSetDevice".split())


def scan_cuda(source: str) -> Optional[str]:
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", source.replace("\\\n", ""), flags=re.S)
    for pattern, why in CUDA_FORBIDDEN.items():
        m = re.search(pattern, code, re.I if "cublas" in pattern else 0)
        if m:
            return f"{why} ({m.group(0).strip()[:40]})"
    return None


def scan_cuda_object(obj_path: str) -> Optional[str]:
    """Why a compiled object (nvcc -c, before linking) is refused, from its undefined symbols."""
    import subprocess

    try:
        out = subprocess.run(["nm", "-u", obj_path], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None  # no nm: the source scan stands alone
    for sym in (line.split()[-1] for line in out.splitlines() if line.strip()):
        name = sym.split("@")[0]
        if name in CUDA_FORBIDDEN_SYMBOLS or name.startswith(("_ZNSt6thread", "_ZNSt7jthread")) or "fstream" in name:
            return f"the compiled kernel calls {name}, which a kernel never needs"
    return None


def has_own_kernel(source: str, language: Language) -> bool:
    if language is Language.CUDA:
        return "__global__" in source
    if language is Language.TRITON:
        return re.search(r"@\s*triton\.jit|@\s*jit\b|@\s*triton\.autotune", source) is not None
    return re.search(r"T\.prim_func|@\s*(tilelang\.)?jit", source) is not None


def static_verdict(source: str, language: Language) -> Optional[str]:
    """Why a source is rejected before it runs, or None."""
    why = scan_cuda(source) if language is Language.CUDA else scan_python(source)
    if why:
        return why
    if not has_own_kernel(source, language):
        return f"defines no {language.value} kernel of its own"
    return None


SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def redact(text: str, environ: Optional[dict] = None) -> str:
    """``text`` with the values of secret-looking variables of this (orchestrator) process blanked."""
    for name, value in (os.environ if environ is None else environ).items():
        if SECRET.search(name) and len(value) >= 8 and value in text:
            text = text.replace(value, "[redacted]")
    return text


class ImportBlocker(MetaPathFinder):
    """Refuses, inside the candidate process, the libraries a kernel must not call."""

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root in FORBIDDEN_MODULES or (LIBRARIES.match(root) and not root.startswith("optagent")):
            raise ImportError(f"optagent: importing {fullname} is not allowed in a candidate kernel")
        return None


# Audit events (PEP 578) and what they mean. Events raised by the candidate's own
# code are refused; those raised inside torch/triton are allowed except the
# always-refused ones; spawning is allowed only to triton (ptxas, launcher builds)
# and to optagent (nvcc). Reading another process's environment or the job file
# (seed, nonce) is refused to everyone but optagent.
EVENT_WHY = {"open": "open a file", "os.": "use the operating system", "subprocess.": "run a subprocess",
             "shutil.": "touch files", "ctypes.": "call native code", "gc.": "read the harness's objects through gc",
             "sys.": "reach into the interpreter", "object.": "reach into interpreter internals",
             "exec": "execute dynamic code", "compile": "compile dynamic code", "socket.": "open a network connection",
             "marshal.": "load code", "pickle.": "load pickled code", "code.": "build code", "function.": "build code",
             "builtins.input": "read stdin", "_thread.": "start a thread", "signal.": "send signals",
             "tempfile.": "create files", "glob.": "list files", "pty.": "spawn a terminal"}
ALWAYS_REFUSED = ("gc.", "os.kill", "os.killpg", "socket.", "signal.pthread_kill", "sys._current_frames",
                  "os.putenv", "os.unsetenv", "sys.settrace", "sys.setprofile")
EVENT_PREFIXES = tuple(EVENT_WHY)
SPAWN = ("subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "pty.")


class AuditGuard:
    def __init__(self, report: Optional[Callable[[str], None]] = None):
        self.report, self.violations, self._busy = report, [], set()
        paths = sysconfig.get_paths()
        self.stdlib = tuple({paths["stdlib"], paths["platstdlib"]})
        self.site = tuple({paths["purelib"], paths["platlib"]})
        self.scratch = os.path.abspath(os.getcwd()) + os.sep  # the worker runs in its scratch directory
        self.optagent = os.path.dirname(os.path.abspath(__file__)) + os.sep
        self.pid = os.getpid()

    def origin(self) -> str:
        """'candidate', 'optagent', 'triton' or 'library': who raised the event (stdlib frames skipped)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<frozen importlib"):
                return "library"  # loading a module the candidate imported: the import rules judged that
            if not (name.startswith("<") or (name.startswith(self.stdlib) and not name.startswith(self.site))):
                if name.startswith(self.scratch) or os.path.basename(name).startswith("candidate"):
                    return "candidate"
                if name.startswith(self.optagent):
                    return "optagent"
                return "triton" if f"{os.sep}triton{os.sep}" in name else "library"
            f = f.f_back
        return "library"

    def __call__(self, event: str, args: tuple) -> None:
        if not event.startswith(EVENT_PREFIXES) or os.getpid() != self.pid:
            return  # cheap exit for imports and the like; a forked child is not ours to judge
        key = threading.get_ident()
        if key in self._busy:
            return  # origin() raises sys._getframe itself
        self._busy.add(key)
        try:
            who = self.origin()
        finally:
            self._busy.discard(key)
        target = str(args[0]) if args and isinstance(args[0], (str, bytes, int, os.PathLike)) else ""
        if who == "optagent":
            return
        if who == "candidate":  # a kernel's own code raises no audited event, bar patching its own classes
            refused = not (event == "object.__setattr__"
                           and str(getattr(args[0], "__module__", "")).startswith("optagent_candidate"))
        else:
            secret = event == "open" and re.search(r"/proc/[^/]+/(environ|mem)$|(^|/)job-\w+\.json$", target)
            refused = bool(secret) or event.startswith(ALWAYS_REFUSED) or (event.startswith(SPAWN) and who != "triton")
        if refused:
            verb = next(v for p, v in EVENT_WHY.items() if event.startswith(p))
            why = f"tried to {verb} at run time ({event}{': ' + target[:80] if target else ''})"
            if not self.violations and self.report is not None:
                self.report(why)
            self.violations.append(why)
            raise PermissionError(f"optagent: a candidate kernel may not {verb} ({event})")


_GUARD: Optional[AuditGuard] = None


def lock_imports(report: Optional[Callable[[str], None]] = None) -> AuditGuard:
    """Lock the candidate process down before candidate code loads: imports, then the audit guard.

    ``report`` (the worker's integrity channel) hears the first violation, so a
    candidate that catches the PermissionError is still rejected.
    """
    global _GUARD
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN_MODULES and not name.startswith("optagent"):
            del sys.modules[name]
    sys.meta_path.insert(0, ImportBlocker())
    if _GUARD is None:
        _GUARD = AuditGuard(report)
        sys.addaudithook(_GUARD)
    return _GUARD
