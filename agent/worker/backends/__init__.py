"""One backend per language: source -> a freshly loaded ``run_kernel`` callable.

``prepare`` does the expensive, shareable work once per candidate (compiling,
import checks); ``load_fresh`` gives every case its own copy of the kernel -
module executed anew, shared library loaded from a new file - so per-process
caches in a kernel never leak from one case to the next, as in the contest,
where each case runs in its own process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from optagent.schema import Language


class CompileError(Exception):
    """The candidate does not build; the message is what the user needs to see."""


class Unsupported(Exception):
    """The candidate's language cannot run here; the message says why."""


class Refused(Exception):
    """The candidate builds but does what a kernel may not (object_scan.py): REJECTED."""


class Backend(Protocol):
    def prepare(self, source_path: Path, scratch: Path) -> None: ...

    def load_fresh(self, tag: str) -> Callable: ...


def backend_for(language: Language, device: str, compiler: list[str] | None, compile_timeout_s: float) -> Backend:
    if language is Language.CUDA:
        from optagent.worker.backends.cuda import CudaBackend

        return CudaBackend(device, compiler, compile_timeout_s)
    from optagent.worker.backends.python import PythonBackend

    return PythonBackend(language, device)
