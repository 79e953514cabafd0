"""Integrity rules that need no GPU: a static scan of the source, and import blocking.

The scan is a first line of defence (it names the forbidden thing before any
code runs); the dynamic checks in the worker and the judge are what a score
rests on.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.abc import MetaPathFinder
from typing import Optional

from .schema import Language

# Libraries that would compute the answer for the candidate.
FORBIDDEN_MODULES = ("flash_attn", "flashinfer", "xformers", "vllm", "sgl_kernel", "sglang", "deep_gemm",
                     "flash_mla", "testcase_config", "optagent_task_hooks", "optagent")
# Python APIs a kernel never needs and a cheating harness attack does.
FORBIDDEN_CALLS = {
    "gc": "reads the harness's objects (gc)",
    "inspect": "inspects the caller's frames (inspect)",
    "sys._getframe": "inspects the caller's frames (sys._getframe)",
    "os._exit": "exits the process before the checks (os._exit)",
    "os.fork": "forks processes (os.fork)", "os.kill": "signals processes (os.kill)",
    "os.system": "runs shell commands (os.system)", "os.popen": "runs shell commands (os.popen)",
    "os.environ": "reads the environment (os.environ)", "os.getenv": "reads the environment (os.getenv)",
    "subprocess": "runs subprocesses (subprocess)", "multiprocessing": "starts processes (multiprocessing)",
    "threading": "starts background threads (threading)", "concurrent": "starts background threads (concurrent)",
    "socket": "opens network connections (socket)", "signal": "installs signal handlers (signal)",
    "ctypes": "calls native code directly (ctypes)", "importlib": "imports modules dynamically (importlib)",
    "builtins": "patches builtins", "open": "opens files (open)", "shutil": "touches files (shutil)",
    "pathlib": "touches files (pathlib)", "exec": "executes dynamic code (exec)", "eval": "evaluates dynamic code (eval)",
    "__import__": "imports modules dynamically (__import__)", "time.perf_counter": "touches the timer",
    "torch.cuda.Event": "touches the timer (torch.cuda.Event)", "torch.cuda.Stream": "launches on a side stream",
    "torch.cuda.stream": "launches on a side stream", "torch.cuda.graph": "captures graphs itself",
    "scaled_dot_product_attention": "calls PyTorch's attention instead of a kernel",
}
CUDA_FORBIDDEN = {
    r"\bsystem\s*\(": "runs shell commands (system)", r"\bpopen\s*\(": "runs shell commands (popen)",
    r"\bfork\s*\(": "forks processes (fork)", r"\bexecv?p?e?\s*\(": "executes programs (exec)",
    r"\bdlopen\s*\(": "loads libraries (dlopen)", r"\bgetenv\s*\(": "reads the environment (getenv)",
    r"\bfopen\s*\(": "opens files (fopen)", r"\b_exit\s*\(|\bexit\s*\(|\babort\s*\(": "exits the process",
    r"\bstd::thread\b|\bpthread_create\b": "starts background threads",
    r"#\s*include\s*[<\"]/": "includes a file by absolute path",
    r"\bcudaStreamCreate": "launches on a side stream", r"\bkill\s*\(": "signals processes",
    r"cublas|cudnn|flash_attn|flashinfer|cutlass/": "calls a library instead of a kernel",
}


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def scan_python(source: str) -> Optional[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # the backend reports it as COMPILE_ERROR with the line
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            base = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                root = full.split(".")[0]
                if root in FORBIDDEN_MODULES:
                    return f"imports {full} (a library or the harness, not a kernel)"
                if alias.asname:
                    aliases[alias.asname] = full
                elif base:
                    aliases[alias.name] = full
                for name, why in FORBIDDEN_CALLS.items():
                    if full == name or full.startswith(name + "."):
                        return why
    for node in ast.walk(tree):
        name = None
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = _dotted(node)
        if not name:
            continue
        head, _, rest = name.partition(".")
        resolved = aliases.get(head, head) + (f".{rest}" if rest else "")
        for forbidden, why in FORBIDDEN_CALLS.items():
            if resolved == forbidden or resolved.startswith(forbidden + "."):
                return why
        if isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            return f"touches {node.id}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__") \
                and node.attr in ("__globals__", "__code__", "__closure__", "__subclasses__", "__dict__",
                                  "__class__", "__bases__", "__mro__", "__builtins__"):
            return f"reaches into interpreter internals ({node.attr})"
    return None


def scan_cuda(source: str) -> Optional[str]:
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    for pattern, why in CUDA_FORBIDDEN.items():
        if re.search(pattern, code, re.I if "cublas" in pattern else 0):
            return why
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


class ImportBlocker(MetaPathFinder):
    """Refuses, inside the candidate process, the libraries a kernel must not call."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FORBIDDEN_MODULES:
            raise ImportError(f"optagent: importing {fullname} is not allowed in a candidate kernel")
        return None


def lock_imports() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN_MODULES and not name.startswith("optagent"):
            del sys.modules[name]
    sys.meta_path.insert(0, ImportBlocker())
