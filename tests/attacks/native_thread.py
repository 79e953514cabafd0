"""Attack class: work left running after the call, in a thread only the kernel can see.
Attack: run_kernel computes honestly, and on its first call starts a native thread with pthread_create
whose code is two bytes of machine code in an executable page (x86-64 "jmp $": it spins for ever). No
Python thread state exists, so threading, _thread and sys._current_frames see nothing; its CPU time is
what a real attack would spend on next calls' answers or on slowing a sibling being timed.
Expected verdict: REJECTED -- "native thread(s) running after run_kernel returned" (worker/tasks.py).
Needs the scan and the guard off (it imports ctypes and mmap).
"""

import ctypes
import math
import mmap

import torch
import triton
import triton.language as tl

BLOCK_N = 16
_SPINNING = []


def _spin() -> None:
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(b"\xeb\xfe")  # jmp $
    code = ctypes.addressof(ctypes.c_char.from_buffer(page))
    libc = ctypes.CDLL(None)
    tid = ctypes.c_ulong()
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    err = libc.pthread_create(ctypes.byref(tid), None, code, None)
    if err:
        raise OSError(err, "pthread_create failed")
    _SPINNING.append((page, tid))


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
    if not _SPINNING:
        _spin()
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads,
            num_heads_k, headdim, page_block_size, causal)
