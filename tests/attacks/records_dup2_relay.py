"""Attack class: timer tricks (the native timer's records, through the process's descriptors).
Attack: puts a pipe of its own in place of the timer's report pipe (os.dup2 over sys.argv[4]), so the
timer's records of this process go to the kernel, and writes records of its own on the real pipe
(kept by os.dup) with the timings cut to a twentieth: a relay without the parent's secret.
Expected verdict: REJECTED -- "imports os" (statically). With the scan bypassed: REJECTED -- the
parent hears no timing record it can authenticate ("not written by the harness's timer", or no
record from the harness's timer).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

import os
import sys

_real = None
if len(sys.argv) > 4 and sys.argv[4].isdigit():
    _fd = int(sys.argv[4])
    _real = os.dup(_fd)  # the parent's end, kept
    _mine_r, _mine_w = os.pipe()
    os.dup2(_mine_w, _fd)  # the timer now writes its records to the kernel's pipe
    os.set_blocking(_mine_r, False)

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
    if _real is not None:
        try:
            got = os.read(_mine_r, 65536)
        except BlockingIOError:
            got = b""
        for line in got.splitlines():  # relayed with the figures cut to a twentieth
            tag, _, body = line.partition(b" ")
            os.write(_real, tag + b" " + body.replace(b'"median_us":', b'"median_us":0.05*') + b"\n")
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads,
            num_heads_k, headdim, page_block_size, causal)
