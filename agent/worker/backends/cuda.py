"""CUDA candidates: ``extern "C" run_kernel`` compiled into a shared library.

The compiler command is configurable (``--compiler`` / ``OPTAGENT_NVCC``) so a
CUDA-compatible vendor toolchain can stand in for nvcc. With nvcc the source is
compiled to an object first, whose imports object_scan.py checks, then linked;
another toolchain builds in its one step, unchecked. Builds are cached by the hash
of source and command; only checked ones are cached under the checked key. Only trusted code
fills the cache (build_all, outside any sandbox); a candidate process builds into its own scratch
directory, and a cached library is used only if its sha256 is the one recorded beside it when it
was built (a library planted or swapped later is not loaded: it is built again, and scanned).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from optagent.cache import CUDA_BUILDS, cache_root
from optagent.schema import Device, KernelFacts
from optagent.settings import settings
from optagent.worker.compiler_facts import parse_ptxas
from optagent.worker.object_scan import scan_cuda_object
from optagent.worker.backends.base import CompileError, Refused

DEFAULT_COMPILER = "nvcc -O3 -shared -Xcompiler -fPIC -lineinfo {arch} -o {out} {src}"
LINK_FLAGS = ("-l", "-L")  # given to the link step only, when the build is two steps


def is_link_flag(part: str) -> bool:
    """-lcublas, -L/usr/lib: the link step's; -lineinfo, which starts alike, is the compiler's."""
    return part.startswith(LINK_FLAGS) and not part.startswith("-lineinfo")
OBJECT_SCAN = "object-scan-1"  # in the cache key: a library built before the check is not reused
SIGNATURE = re.compile(r'extern\s+"C"\s+(?:__host__\s+)?void\s+run_kernel\s*\(([^)]*)\)', re.S)

CTYPES = {
    "int64_t": ctypes.c_int64, "long": ctypes.c_int64, "long long": ctypes.c_int64, "size_t": ctypes.c_size_t,
    "int32_t": ctypes.c_int32, "int": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "unsigned": ctypes.c_uint32,
    "float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool,
}


def parse_signature(source: str) -> list:
    """ctypes argument types of run_kernel, read from the candidate's own definition."""
    m = SIGNATURE.search(source)
    if not m:
        raise CompileError('no `extern "C" void run_kernel(...)` in the source')
    types = []
    for raw in m.group(1).split(","):
        param = " ".join(raw.replace("const", " ").replace("__restrict__", " ").split())
        if not param or param == "void":
            continue
        if "*" in param:
            types.append(ctypes.c_void_p)
            continue
        base = " ".join(param.split()[:-1])
        if base not in CTYPES:
            raise CompileError(f"run_kernel parameter {param!r}: unsupported type {base!r}")
        types.append(CTYPES[base])
    return types


def _arch_flag(device: Device) -> str:
    if device == Device.CUDA:
        import torch

        major, minor = torch.cuda.get_device_capability()
        suffix = "a" if major >= 9 else ""
        return f"-gencode=arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}"
    return "-arch=sm_90"  # no GPU: compile for Hopper so compile errors are real


def cache_dir() -> Path:
    return cache_root() / "cuda"


class CudaBackend:
    # run_kernel launches on the legacy default stream, which a CUDA graph
    # capture on torch's capture stream does not record: time it with events.
    graph_capturable = False

    def __init__(self, device: Device, compiler: list[str] | None, compile_timeout_s: float):
        self.device = device
        self.compiler = compiler or shlex.split(settings().nvcc or DEFAULT_COMPILER)
        self.timeout = compile_timeout_s
        self.library: Path | None = None
        self.kernel_facts: list[KernelFacts] = []  # from ptxas -v, when nvcc built it

    def _two_step(self) -> bool:
        return Path(self.compiler[0]).name == "nvcc" and "-shared" in self.compiler

    def _command(self, out: Path, src: Path, arch: str, compile_only: bool = False) -> list[str]:
        cmd = []
        for part in self.compiler:
            if part == "{arch}":
                cmd.extend(arch.split())
            elif compile_only and part == "-shared":
                cmd.append("-c")
            elif not (compile_only and is_link_flag(part)):
                cmd.append(part.format(out=out, src=src, arch=arch))
        if Path(cmd[0]).name == "nvcc":  # ptxas -v: registers, spills, shared memory per kernel (compiler_facts.py)
            cmd[1:1] = ["-Xptxas", "-v"]
        return cmd

    def _run(self, cmd: list[str], scratch: Path, source_path: Path) -> str:
        if shutil.which(cmd[0]) is None:
            raise CompileError(f"compiler {cmd[0]!r} not found (set --compiler or OPTAGENT_NVCC)")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout, cwd=scratch)
        except subprocess.TimeoutExpired:
            raise CompileError(f"compiler timed out after {self.timeout:.0f} s") from None
        if proc.returncode != 0:
            raise CompileError(first_errors(proc.stderr + proc.stdout, source_path))
        return proc.stderr + proc.stdout

    def prepare(self, source_path: Path, scratch: Path, fill_cache: bool = False) -> None:
        """fill_cache: keep the build for later processes (trusted callers only: build_all)."""
        source = source_path.read_text(encoding="utf-8")
        self.argtypes = parse_signature(source)
        arch = _arch_flag(self.device)
        checked = OBJECT_SCAN if self._two_step() else "unchecked"
        key = hashlib.sha256("\0".join([source, " ".join(self.compiler), arch, checked]).encode()).hexdigest()[:24]
        cached = cache_dir() / f"{key}.so"
        self.scratch = scratch
        facts_file = cached.with_suffix(".facts.json")
        known = verified_build(cached, facts_file)
        if known is not None:
            self.library, self.kernel_facts = cached, known
            return
        out = scratch / CUDA_BUILDS / f"{key}.so"  # builds of different sources may share a scratch dir
        out.parent.mkdir(exist_ok=True)
        if self._two_step():
            obj = out.with_suffix(".o")
            lent = verified_build(obj, obj.with_suffix(".facts.json"))
            if lent is not None:  # this source's object, kept when it passed (evaluation/builds.py): no compile
                self.kernel_facts = lent
            else:
                self.kernel_facts = parse_ptxas(self._run(self._command(obj, source_path, arch, compile_only=True),
                                                          scratch, source_path))
                try:  # for the next process this build is lent to (it runs no ptxas)
                    record_build(obj, obj.with_suffix(".facts.json"), self.kernel_facts)
                except OSError:
                    pass  # the next evaluation compiles again
            # a lent object is scanned again: the process that compiled it ran the kernel after its scan
            why = scan_cuda_object(str(obj))
            if why:
                raise Refused(why)
            libs = [p for p in self.compiler if is_link_flag(p)]
            # no device link: the object is whole-program code, as a one-step build leaves it
            self._run([self.compiler[0], "-shared", "--no-device-link", "-o", str(out), str(obj), *libs],
                      scratch, source_path)
        else:
            self.kernel_facts = parse_ptxas(self._run(self._command(out, source_path, arch), scratch, source_path))
        if not out.exists():
            raise CompileError("the compiler exited without writing the library")
        self.library = out
        if not fill_cache:
            return
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(out, tmp)
            record_build(tmp, facts_file, self.kernel_facts)
            os.replace(tmp, cached)
        except OSError:  # a read-only cache: the build in scratch serves
            return
        self.library = cached

    def load_fresh(self, tag: str) -> Callable:
        if self.device != Device.CUDA:
            from optagent.worker.backends.base import Unsupported

            raise Unsupported("compiled; running CUDA kernels needs a CUDA GPU")
        assert self.library is not None
        # dlopen keys on the path: a fresh file gives fresh static state.
        path = self.scratch / f"candidate_{tag}.so"
        shutil.copyfile(self.library, path)
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        fn = lib.run_kernel
        fn.argtypes = self.argtypes
        fn.restype = None
        argtypes = self.argtypes

        def run_kernel(*args):
            if len(args) != len(argtypes):
                raise TypeError(f"run_kernel takes {len(argtypes)} arguments, the case has {len(args)}")
            converted = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
            fn(*converted)

        return run_kernel


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_build(library: Path, facts: Path, kernel_facts: list[KernelFacts]) -> None:
    """ptxas's facts beside a build, with the sha256 verified_build() holds the build to."""
    facts.write_text(json.dumps({"sha256": _sha256(library),
                                 "facts": [f.model_dump(mode="json") for f in kernel_facts]}))


def verified_build(library: Path, facts: Path) -> list[KernelFacts] | None:
    """The build's facts if the library (or object) is the one that was built (its recorded sha256), else None:
    the trusted cache's, and a candidate's own object lent back to it (which its scan then checks again)."""
    try:
        record = json.loads(facts.read_text())
        if not isinstance(record, dict) or _sha256(library) != record.get("sha256"):
            return None  # planted, swapped, or cached before hashes were kept: built again
        return [KernelFacts.model_validate(f) for f in record.get("facts", [])]
    except (OSError, ValueError, TypeError):
        return None


def build_all(paths: Sequence[Path], device: Device = Device.CUDA, timeout_s: float = 600) -> dict[Path, str]:
    """Builds every source into the build cache at once (one nvcc uses one core), each in
    its own folder's scratch; returns why each one that failed did, by path."""
    def build(path: Path) -> str:
        try:
            CudaBackend(device, None, timeout_s).prepare(path, path.parent, fill_cache=True)
            return ""
        except Exception as e:  # reported to the caller, who decides what a failure means
            return f"{type(e).__name__}: {str(e)[:300]}"

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        errors = list(pool.map(build, paths))
    return {p: e for p, e in zip(paths, errors) if e}


def first_errors(log: str, source_path: Path, lines: int = 8) -> str:
    """nvcc's first error lines, with the scratch path shortened to the file name."""
    log = log.replace(str(source_path), source_path.name)
    errs = [ln for ln in log.splitlines() if "error" in ln.lower()]
    picked = errs[:lines] or log.strip().splitlines()[:lines]
    return "\n".join(picked) or "the compiler failed without a message"
