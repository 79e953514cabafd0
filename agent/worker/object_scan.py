"""What a compiled CUDA candidate may call on the host: a check of its object file.

A CUDA kernel's host code runs in the candidate process in C, where the Python audit
hooks see nothing, and a source scan can be talked around (``open64(``, a ``weak``
declaration of ``__libc_system``, a ``syscall`` spelled as bytes). So the backend compiles
to an object first (``nvcc -c``, before the static CUDA runtime is linked in, since that
imports much of libc itself) and refuses an object that imports anything outside an
allowlist - the CUDA runtime, C math, memory and string functions, printing to the
standard streams, the C++ runtime and standard library without threads, files or
processes - or that carries a system-call instruction in its host code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Optional

from optagent.integrity import scan_cuda

MATH = re.compile(r"(?:__)?(?:sqrt|cbrt|hypot|exp|exp2|exp10|expm1|log|log2|log10|log1p|pow|fabs|floor|ceil|round"
                  r"|lround|llround|trunc|rint|lrint|nearbyint|fmod|remainder|fmax|fmin|fma|fdim|copysign|ldexp"
                  r"|frexp|modf|tanh|sinh|cosh|asinh|acosh|atanh|sin|cos|tan|sincos|asin|acos|atan|atan2|erf"
                  r"|erfc|tgamma|lgamma)[fl]?(?:_finite)?")
ALLOWED = frozenset("""
    _GLOBAL_OFFSET_TABLE_ __dso_handle __gxx_personality_v0 __stack_chk_fail __assert_fail __errno_location
    __tls_get_addr atexit exit
    malloc calloc realloc free posix_memalign aligned_alloc memalign
    memcpy memmove memset memcmp memchr strlen strnlen strcmp strncmp strcpy strncpy strcat strncat strchr
    strrchr strstr strtol strtoul strtoll strtoull strtod strtof atoi atol atof abs labs llabs qsort bsearch
    rand srand time clock clock_gettime
    printf fprintf vprintf vfprintf puts putchar putc fputs fputc fwrite fflush snprintf sprintf vsnprintf vsprintf
    sscanf perror strerror stdout stderr __dynamic_cast
    __isnan __isnanf __isinf __isinff __finite __finitef __fpclassify __fpclassifyf __signbit __signbitf
    __printf_chk __fprintf_chk __vfprintf_chk __sprintf_chk __snprintf_chk __vsnprintf_chk __memcpy_chk
    __memmove_chk __memset_chk __strcpy_chk __strncpy_chk __strcat_chk
    pthread_once pthread_mutex_lock pthread_mutex_unlock __pthread_key_create pthread_key_create
    pthread_getspecific pthread_setspecific
""".split())
PREFIXES = ("cuda", "__cuda", "__nv", "__cxa_", "_Unwind_", "_Znw", "_Zna", "_Zdl", "_Zda")
# type information of the standard library's and fundamental types (exceptions, RTTI), and
# the compiler's own arithmetic helpers (libgcc: 128-bit division, half-float conversion)
RUNTIME = re.compile(r"_ZT[ISV](?:N?St|N10__cxxabiv1|P?K?[a-z]\b)\w*"
                     r"|__(?:extend|trunc|float|fixuns|fix|u?div|u?mod|mul|popcount|clz|ctz|bswap|powi)[a-z]*\d?")
# the C++ standard library's mangled names (std::, std::ostream, std::string's old ABI) ...
STD = ("_ZSt", "_ZNSt", "_ZNKSt", "_ZNSo", "_ZNKSo", "_ZNSi", "_ZNKSi", "_ZNSs", "_ZNKSs", "_ZNSd")
# ... except these parts of it
STD_REFUSED = re.compile(r"thread|fstream|filebuf|__basic_file|filesystem|future|async|system\b|random_device")
SYSCALL = re.compile(r"^\s*[0-9a-f]+:\s+(?:syscall|sysenter|int\s+\$0x80)\b", re.M)


def allowed(name: str) -> bool:
    if name in ALLOWED or MATH.fullmatch(name) or RUNTIME.fullmatch(name):
        return True
    if name.startswith(PREFIXES):
        return scan_cuda(name + "()") is None  # not a side stream, host callback, device reset...
    return name.startswith(STD) and not STD_REFUSED.search(name)


def scan_cuda_object(obj_path: str) -> Optional[str]:
    """Why an object file (nvcc -c) is refused, or None; None too where binutils are missing."""
    if shutil.which("nm") is None:
        return None
    try:
        out = subprocess.run(["nm", "-u", obj_path], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.strip()]
    refused = sorted({n for n in names if not allowed(n)})
    if refused:
        listed = ", ".join(refused[:4]) + (f" and {len(refused) - 4} more" if len(refused) > 4 else "")
        return (f"the compiled kernel calls {listed}: outside what a kernel may call on the host (the CUDA "
                "runtime, C math, memory and strings, printing, the C++ library without threads or files)")
    if shutil.which("objdump"):
        try:
            dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj_path], capture_output=True,
                                 text=True, timeout=120).stdout
        except (OSError, subprocess.TimeoutExpired):
            dis = ""
        if SYSCALL.search(dis):
            return "the compiled kernel makes system calls directly (a syscall instruction in its host code)"
    return None
