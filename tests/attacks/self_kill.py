"""Attack class: harness attacks.
Attack: the kernel SIGKILLs its own process.
Expected verdict: REJECTED -- "imports os".  With the scan bypassed: refused by the audit
guard (os.kill), or RUNTIME_ERROR "killed by SIGKILL".
"""

import math

import torch
import triton
import triton.language as tl

import os
import signal

BLOCK_N = 16


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
    os.kill(os.getpid(), signal.SIGKILL)
