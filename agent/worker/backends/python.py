"""Triton and TileLang candidates: Python modules defining ``run_kernel``."""

from __future__ import annotations

import gc
import importlib.util
import shutil
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

from optagent.integrity import python_syntax_error
from optagent.schema import Device, Language
from optagent.worker.backends.base import CompileError, Unsupported


class PythonBackend:
    def __init__(self, language: Language, device: Device):
        self.language = language
        self.device = device
        self.source_path: Path | None = None
        self.module: ModuleType | None = None  # the last case's

    def prepare(self, source_path: Path, scratch: Path) -> None:
        if self.language is Language.TILELANG:
            if importlib.util.find_spec("tilelang") is None:
                raise Unsupported("TileLang is not installed in this environment (pip install tilelang)")
            if self.device != Device.CUDA:
                raise Unsupported("TileLang kernels need a CUDA GPU; none is visible")
        bad = python_syntax_error(source_path.read_text(encoding="utf-8"))
        if bad:
            raise CompileError(bad)
        self.scratch = scratch
        self.source_path = source_path

    def load_fresh(self, tag: str) -> Callable:
        assert self.source_path is not None
        self.release()
        # A new file name per case: Triton keys its in-memory caches on the
        # function object, and tracebacks then name the case.
        path = self.scratch / f"candidate_{tag}.py"
        shutil.copyfile(self.source_path, path)
        name = f"optagent_candidate_{tag}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        self.module = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise CompileError(_short_traceback(e, path)) from None
        fn = getattr(module, "run_kernel", None)
        if not callable(fn):
            raise CompileError("the module defines no callable run_kernel")
        return fn

    def release(self) -> None:
        """Drops the last case's module: what it holds (a 4 GiB global) must not pile up case after case.
        Its data is dropped from its namespace too, since the old run_kernel and Triton's caches still
        reach it; its names stay, so a function of it that is still called (a patch it installed, to
        be reported as such) finds its own globals rather than failing with a NameError."""
        module, self.module = self.module, None
        if module is not None:
            sys.modules.pop(module.__name__, None)
            for name in [n for n, v in module.__dict__.items() if _holds_data(v)]:
                del module.__dict__[name]
            gc.collect()


def _holds_data(value: object) -> bool:
    """Tensors and arrays, or a container of them: what makes a dropped module's namespace heavy."""
    def heavy(v: object) -> bool:
        return isinstance(v, torch.Tensor) or type(v).__name__ == "ndarray"
    if heavy(value):
        return True
    if isinstance(value, dict):
        return any(heavy(v) for v in value.values())
    return isinstance(value, (list, tuple, set)) and any(heavy(v) for v in value)


def _short_traceback(e: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"
