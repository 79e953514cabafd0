"""Attack class: the sandbox's kernel interface (new namespaces, ptrace, another process's memory).
Attack: through ctypes, at import: a new user and mount namespace (where it is root, and may mount
over the read-only view), ptrace on its parent, and process_vm_readv of its parent's memory. Each
one that works is named in the error it raises; none working, it computes honestly.
Expected verdict: PASSED -- the seccomp filter on the candidate process (worker/seccomp.py) refuses
every one with EPERM, under bwrap and Landlock alike. Needs the scan and the guard off (ctypes).
"""

import ctypes
import math
import os

import torch
import triton
import triton.language as tl

BLOCK_N = 16
_libc = ctypes.CDLL(None, use_errno=True)
_won = []
if _libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
    _won.append("unshare")
if _libc.syscall(56 if os.uname().machine == "x86_64" else 220, 0x20000000 | 17, 0, 0, 0, 0) == 0:
    os._exit(0)  # the child in its new PID namespace
if _libc.ptrace(16, os.getppid(), 0, 0) == 0:  # PTRACE_ATTACH
    _won.append("ptrace")


class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_buf = ctypes.create_string_buffer(64)
_local, _remote = _Iov(ctypes.addressof(_buf), 64), _Iov(0x400000, 64)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
if _libc.process_vm_readv(os.getppid(), ctypes.byref(_local), 1, ctypes.byref(_remote), 1, 0) > 0 \
        or ctypes.get_errno() not in (1,):  # EFAULT or ESRCH: the call itself was allowed
    _won.append("process_vm_readv")
if _won:
    raise RuntimeError("escaped: " + ", ".join(_won))


# attack fixture: the decode starter's kernel and _launch(heads, scale) stand here (tests/attacks/decode_kernel.inc)


def run_kernel(
    q,
    k_cache_paged,
    v_cache_paged,
    output,
    cache_seqlens,
    block_table,
    batch_size,
    seqlen_k,
    seqlen_q,
    num_heads,
    num_heads_k,
    headdim,
    page_block_size,
    num_blocks,
    causal,
):
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
