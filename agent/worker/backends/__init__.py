"""One backend per language: source -> a freshly loaded ``run_kernel`` callable.

``prepare`` does the expensive, shareable work once per candidate (compiling,
import checks); ``load_fresh`` gives every case its own copy of the kernel -
module executed anew, shared library loaded from a new file - so per-process
caches in a kernel never leak from one case to the next, as in the contest,
where each case runs in its own process.
"""

from __future__ import annotations

from optagent.schema import Device, Language
from optagent.worker.backends.base import Backend, CompileError, Refused, Unsupported  # noqa: F401 (the package's API)


def backend_for(language: Language, device: Device, compiler: list[str] | None, compile_timeout_s: float) -> Backend:
    if language is Language.CUDA:
        from optagent.worker.backends.cuda import CudaBackend

        return CudaBackend(device, compiler, compile_timeout_s)
    from optagent.worker.backends.python import PythonBackend

    return PythonBackend(language, device)
