"""Integrity rules that read a candidate's source: the static scan (run-time guards: ``worker/guard``).

Torch-free and below both sides of the process boundary: the parent scans a source before any
worker starts, and the worker's guard and object scan take their tables from here.

The scan names the forbidden thing before any code runs. A list of bad calls is
dodged by ``getattr(__import__('o'+'s'), ...)``, so instead it bounds what a
kernel file can reach at all: imports from an allowlist; no dynamic code, no
computed attribute names, no dunders or frame attributes, no patching of
modules; host code (outside ``@triton.jit``) may not do the math with PyTorch.
What gets past it meets ``guard.lock_imports``: an import blocker and a PEP 578 audit
hook (Python code cannot remove one) refusing process, file, frame and gc access
made by the candidate's own code; and ``guard.watch_host_compute``, which tells a
kernel from PyTorch doing the work. The worker's and the judge's checks are what
a score rests on; this module narrows what a candidate can try.
"""

from __future__ import annotations

import ast
import re
from typing import Optional

from optagent.schema import Language
from optagent.text import parse

# Libraries that would compute the answer, and the harness's modules; a prefix match, so
# flash_attn_2_cuda (FlashAttention's extension) and optagent_task_hooks (the reference) count.
LIBRARIES = re.compile(r"flash_?attn|flashinfer|flash_mla|xformers|vllm|sgl_kernel|sglang|deep_gemm|apex|"
                       r"transformer_engine|liger_kernel|flag_gems|triton_kernels|tensorrt|torch_tensorrt|"
                       r"testcase_config|optagent")
ALLOWED_IMPORTS = set("__future__ math cmath typing typing_extensions functools itertools dataclasses enum "
                      "collections numbers abc warnings copy torch triton tilelang".split())


def table(groups: dict[str, str]) -> dict[str, str]:
    """{why: "name name ..."} -> {name: why}: the reason written once for each group of names."""
    return {name: why for why, names in groups.items() for name in names.split()}


MODULE_WHY = table({  # why a module is refused (the rest: "not needed by a kernel")
    "processes, files and the environment": "os posix nt", "reaches into the interpreter": "sys",
    "reads the harness's objects": "gc", "inspects the caller's frames": "inspect traceback",
    "runs other processes": "subprocess multiprocessing pty", "opens network connections": "socket ssl http urllib",
    "starts background threads": "threading _thread concurrent asyncio sched", "installs signal handlers": "signal",
    "calls native code directly": "ctypes cffi _ctypes", "patches builtins": "builtins",
    "imports modules dynamically": "importlib imp runpy pkgutil zipimport", "touches the clock": "time timeit",
    "touches files": "shutil pathlib io tempfile glob fcntl mmap fileinput", "runs code after the checks": "atexit",
    "decodes hidden code or data": "pickle marshal dill base64 binascii codecs zlib bz2 lzma",
    "builds code at run time": "code codeop types ast dis", "computes on the host": "numpy scipy jax"})
FORBIDDEN_ATTRS = table({  # whatever object they are reached through (torch.os, triton.runtime.jit.sys...)
    "reaches a module it may not import": "os posix sys gc inspect subprocess multiprocessing threading _thread "
                                          "ctypes importlib builtins shutil pathlib socket runpy pickle marshal",
    "touches processes or the environment": "environ environb getenv putenv unsetenv _exit system popen fork forkpty "
                                            "kill killpg execv execve execvp execvpe execl execle execlp spawnv "
                                            "spawnve posix_spawn posix_spawnp",
    "inspects frames or the interpreter": "_getframe _current_frames settrace setprofile meta_path path_hooks modules "
                                          "addaudithook f_back f_globals f_locals f_builtins f_code tb_frame tb_next "
                                          "gi_frame gi_code cr_frame ag_frame co_code co_consts",
    "reads or writes files": "save from_file tofile fromfile load_library load_inline cpp_extension",
    "touches the timer": "perf_counter perf_counter_ns monotonic elapsed_time Event",
    "launches on a side stream or captures graphs": "Stream ExternalStream stream set_stream streams graph graphs "
                                                    "CUDAGraph",
    "uses private interpreter bindings": "_C _dynamo _inductor",
    "builds native code or touches the compiler's cache": "build compile_module_from_src get_cache_manager "
                                                          "get_override_manager get_dump_manager FileCacheManager"})
# torch.X for these X: libraries, code loading and compilation, files, dispatch hooks.
TORCH_FORBIDDEN = set("load save from_file compile export hub utils package classes library ops jit multiprocessing "
                      "distributed profiler nn special linalg func fx overrides backends serialization".split())
# PyTorch math that computes attention on the host; math.exp and tl.exp are fine.
TORCH_MATH = set("softmax log_softmax matmul bmm baddbmm mm addmm addbmm einsum tensordot mv dot inner outer exp exp_ "
                 "exp2 expm1 logsumexp sigmoid scaled_dot_product_attention numpy".split())
# __version__ is a module's version string: reading it (to choose a code path) reaches nothing
ALLOWED_DUNDERS = set("__init__ __name__ __qualname__ __doc__ __call__ __len__ __getitem__ __setitem__ __iter__ "
                      "__next__ __enter__ __exit__ __repr__ __str__ __eq__ __hash__ __post_init__ __version__".split())
MAX_LISTED = 12  # violations named in one verdict: an obfuscated file can have hundreds
FORBIDDEN_NAMES = table({"imports modules dynamically": "__import__", "runs dynamic code": "exec eval compile",
                         "opens files": "open", "reads namespaces": "globals locals vars", "patches attributes":
                         "setattr delattr", "debugs or reads stdin": "breakpoint input",
                         "touches the module machinery": "__builtins__ __loader__ __spec__"})
JIT_DECORATORS = {"jit", "autotune", "heuristics", "prim_func", "macro"}
FORMAT_ATTR = re.compile(r"\{[^{}]*\.(_\w*|f_\w+|tb_\w+)")  # "{0.__globals__}".format(f) walks attributes too


def _kernels(tree: ast.AST, aliases: dict[str, str], roots: tuple[str, ...] = ("triton", "tilelang")) -> list[ast.AST]:
    """The functions decorated as device code by Triton's or TileLang's own decorators: the decorator
    must resolve through the file's imports (a local function named `jit` marks nothing)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                parts = _parts(d, aliases)
                if _imported(d, aliases) and parts[0] in roots and parts[-1] in JIT_DECORATORS:
                    out.append(node)
                    break
    return out


def _imports(tree: ast.AST) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            base = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                aliases[alias.asname or (alias.name if base else full.split(".")[0])] = \
                    full if (alias.asname or base) else full.split(".")[0]
    return aliases


def _parts(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """a.b.c -> [*resolved a, 'b', 'c'] (imports resolved); '?' for a root that is not a name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (aliases.get(node.id, node.id) if isinstance(node, ast.Name) else "?").split(".") + attrs[::-1]


def _imported(node: ast.AST, aliases: dict[str, str]) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id in aliases


def _chain_why(parts: list[str], host: bool, imported: bool) -> Optional[str]:
    """Why a dotted access is refused; ``imported`` when its root is an imported module."""
    name = ".".join(parts)
    for p in parts[1:]:
        if p.startswith("__") and p.endswith("__") and p not in ALLOWED_DUNDERS:
            return f"reaches into Python's interpreter internals through the dunder attribute {p} ({name})"
        if p in FORBIDDEN_ATTRS:
            return f"{FORBIDDEN_ATTRS[p]} ({name})"
        if imported and p.startswith("_") and p != "__version__" and parts[0] in ("torch", "triton"):
            return f"uses {p}, a private name of {parts[0]} (its internals, not its API) ({name})"
    if imported and parts[0] == "torch" and len(parts) > 1 and parts[1] in TORCH_FORBIDDEN:
        return f"uses torch.{parts[1]}, which a kernel file may not use ({name})"
    if host and parts[0] not in ("math", "cmath", "triton") and any(p in TORCH_MATH for p in parts[1:]):
        return f"computes with PyTorch on the host ({name}) instead of in its own kernel"
    return None


def _import_why(node: ast.AST, aliases: dict[str, str]) -> Optional[str]:
    if isinstance(node, ast.ImportFrom) and node.level:
        return "uses a relative import (a kernel file stands alone)"
    base = node.module if isinstance(node, ast.ImportFrom) else None
    for alias in node.names:
        full = f"{base}.{alias.name}" if base else alias.name
        root = full.split(".")[0]
        if LIBRARIES.match(root):
            return f"imports {full} (a library or the harness, not a kernel)"
        if root not in ALLOWED_IMPORTS:
            return (f"imports {root} ({MODULE_WHY.get(root, 'not needed by a kernel')}); a kernel file may import "
                    f"only {', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}")
        if alias.name == "*":
            return f"uses `from {base} import *` (names must be visible to the scan)"
        why = _chain_why(full.split("."), host=True, imported=True) if root != "__future__" else None
        if why:
            return why
        aliases[alias.asname or (alias.name if base else root)] = full if (alias.asname or base) else root
    return None


def python_syntax_error(source: str) -> Optional[str]:
    """The source's syntax error as one line, ``SyntaxError: <what> (line N): <the line>``, or None."""
    try:
        parse(source)
    except SyntaxError as e:  # IndentationError and TabError too
        where = f" (line {e.lineno})" if e.lineno else ""
        text = (e.text or "").strip().replace("\0", "")
        return f"SyntaxError: {e.msg}{where}" + (f": {text}" if text else "")
    except ValueError as e:  # null bytes, on Pythons that say so with a ValueError
        return f"SyntaxError: {e}"
    return None


def python_violations(source: str) -> list[tuple[int, str]]:
    """Every rule the source breaks, as (line, why), in line order; one per line and kind of reason."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return []  # python_syntax_error's, reported first as COMPILE_ERROR with the line
    found: dict[tuple[int, str], str] = {}

    def add(node: ast.AST, why: str) -> None:  # the outermost chain of a line comes first (ast.walk is breadth-first)
        found.setdefault((getattr(node, "lineno", 0), why.split(" (")[0]), why)

    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            why = _import_why(node, aliases)
            if why:
                add(node, why)
    device: set[int] = set()  # nodes inside @triton.jit / autotune / prim_func functions (imported ones)
    for node in _kernels(tree, aliases):
        device.update(id(n) for n in ast.walk(node))
    for _ in range(2):  # `cuda = torch.cuda` makes cuda an alias too (two rounds: chains of aliases)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, (ast.Name, ast.Attribute)) and _imported(node.value, aliases):
                aliases[node.targets[0].id] = ".".join(_parts(node.value, aliases))
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        host, why = id(node) not in device, None
        if isinstance(node, ast.Name):
            if node.id == "getattr" and id(node) not in called:
                why = "passes getattr around (attribute names must be visible to the scan)"
            elif node.id in FORBIDDEN_NAMES and node.id not in aliases:
                why = f"{FORBIDDEN_NAMES[node.id]} ({node.id})"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                why = "computes an attribute name at run time (getattr with a non-literal name)"
            else:
                why = _chain_why(_parts(node.args[0], aliases) + [name.value], host, _imported(node.args[0], aliases))
        elif isinstance(node, ast.Attribute):
            why = _chain_why(_parts(node, aliases), host, _imported(node, aliases))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            hit = next((s for t in targets for s in ast.walk(t)
                        if isinstance(s, ast.Attribute) and _imported(s, aliases)), None)
            if hit is not None:
                why = f"patches {'.'.join(_parts(hit, aliases))} (a kernel never changes library state)"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and host:
            why = "computes with PyTorch on the host (the @ operator) instead of in its own kernel"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and FORMAT_ATTR.search(node.value):
            why = "walks attributes through a format string"
        if why:
            add(node, why)
    return [(line, why) for (line, _), why in sorted(found.items(), key=lambda kv: kv[0][0])]


def listed(violations: list[tuple[int, str]]) -> Optional[str]:
    """Violations as one text: "line 3: imports os (...); line 9: ..."; None when there are none."""
    if not violations:
        return None
    shown = [f"line {line}: {why}" if line else why for line, why in violations[:MAX_LISTED]]
    more = len(violations) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def scan_python(source: str) -> Optional[str]:
    """Every violation of the scan's rules, each with its line, or None."""
    return listed(python_violations(source))


# CUDA: comments removed and line continuations spliced first, so `sys\<newline>tem(` reads as the compiler sees it.
CUDA_FORBIDDEN = {
    r"##|%:%:": "builds identifiers by token pasting (##), which hides what the code calls",
    r"\\[uU][0-9a-fA-F]{4}": "spells identifiers with universal character names",
    r"\b(?:system|popen|fork|vfork|posix_spawnp?|exec[lv]p?e?|clone)\b": "runs other programs",
    r"\b(?:dlopen|dlsym|dlmopen|dlvsym)\b": "loads libraries at run time",
    r"\b(?:getenv|secure_getenv|setenv|putenv|environ|__environ)\b": "reads the environment",
    r"\b(?:fopen|freopen|fdopen|tmpfile|mkstemp|open|openat|creat|unlink|rename|mkdir)\s*\(|"
    r"\b(?:[io]?fstream|filebuf|filesystem)\b": "opens files",
    r"\b(?:_exit|_Exit|exit|quick_exit|abort)\s*\(": "exits the process",
    r"\bstd::j?thread\b|\bstd::async\b|\bpthread_create\b|#\s*pragma\s+omp": "starts background threads",
    r"\b(?:kill|killpg|raise|signal|sigaction)\s*\(": "signals processes",
    r"\b(?:syscall|ptrace|prctl|mprotect|socket|connect)\b": "makes system calls directly",
    r"\bcudaStreamCreate\w*|\bcuStreamCreate\w*": "launches on a side stream",
    r"\bcudaLaunchHostFunc\b|\bcudaStreamAddCallback\b": "runs host callbacks outside the timed call",
    r"\bcudaDeviceReset\b|\bcudaSetDevice\b|\bcudaIpc\w+": "resets, switches or shares the device",
    r"__attribute__\s*\(\(\s*constructor": "runs code when the library is loaded",
    r"#\s*include\s*[<\"](?:/|\.\.|unistd|sys/|fcntl|dlfcn|spawn|signal|csignal|thread|future|fstream|filesystem|"
    r"pthread|Python|pybind11|torch/|ATen/|c10/)": "includes a system or framework header a kernel does not need",
    r"/proc/|\.\./": "names paths outside its scratch directory",
    r"cublas|cudnn|flash_?attn|flashinfer|cutlass/": "calls a library instead of a kernel",
}
def scan_cuda(source: str) -> Optional[str]:
    """Every rule the source breaks (the first match of each), or None."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", source.replace("\\\n", ""), flags=re.S)
    found = []
    for pattern, why in CUDA_FORBIDDEN.items():
        m = re.search(pattern, code, re.I if "cublas" in pattern else 0)
        if m:
            found.append((0, f"{why} ({m.group(0).strip()[:40]})"))
    return listed(found)


def has_own_kernel(source: str, language: Language) -> bool:
    """Read from the code, not the text: a docstring or comment that says `@triton.jit` or `__global__`
    is no kernel, nor is a function decorated by a local `jit`."""
    if language is Language.CUDA:
        code = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"", "", source.replace("\\\n", ""), flags=re.S)
        return re.search(r"\b__global__\b", code) is not None
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return False
    return bool(_kernels(tree, _imports(tree), ("triton",) if language is Language.TRITON else ("tilelang",)))


def static_verdict(source: str, language: Language) -> Optional[str]:
    """Why a source is rejected before it runs, or None."""
    why = scan_cuda(source) if language is Language.CUDA else scan_python(source)
    own = None if has_own_kernel(source, language) else f"defines no {language.value} kernel of its own"
    return "; ".join(filter(None, (why, own))) or None

